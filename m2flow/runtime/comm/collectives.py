"""A sum over the ranks of one group through the communicator: every rank sends its tensor to all others.

Between CPU ranks on one node this moves the tensor through shared memory, one copy for all receivers,
and costs one wake-up per peer. A gloo all-reduce of the same 4 MiB between two ranks here took
5.3-5.9 ms against 1.4 ms for this exchange and the add (`docs/benchmarks/g1.md`), and a gloo all-reduce of
a few floats 1.4-1.8 ms; on a 2-core machine every such wake-up waits for a core. The exchange sends
the whole tensor to every peer, so it is meant for a few ranks (a ring all-reduce moves less data as
the group grows).

The sum is bitwise the same on every rank, as the replicas of a data-parallel model need: every rank
adds the terms in rank order (with two ranks, in either order: a + b == b + a exactly).
"""

from __future__ import annotations

import torch

from m2flow.runtime.comm.communicator import Communicator
from m2flow.runtime.comm.errors import CommError
from m2flow.runtime.comm.transport import LinkKind

_TAG = "m2flow-sum"


class ExchangeSum:
    """``__call__(tensor)`` replaces ``tensor`` in place by its sum over ranks ``0..world_size-1`` of ``group``.

    Every rank calls it with tensors of the same shape and dtype, in the same order; the messages of
    one call are told apart from any other traffic between the ranks by a tag and a sequence number.
    """

    def __init__(self, comm: Communicator, group: str, rank: int, world_size: int) -> None:
        self.comm = comm
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.calls = 0

    def _any_local(self, peers: list[int]) -> bool:
        if not hasattr(self, "_local"):
            self._local = any(self.comm.transport_to(self.group, r) == LinkKind.IN_PROCESS for r in peers)
        return self._local

    def __call__(self, tensor: torch.Tensor) -> None:
        if self.world_size == 1:
            return
        if tensor.device.type != "cpu":
            raise ValueError(f"ExchangeSum sums host tensors; got one on {tensor.device}")
        seq = self.calls
        self.calls += 1
        peers = [r for r in range(self.world_size) if r != self.rank]
        # A peer in this very process receives the object itself, which is about to change in place.
        payload = tensor.clone() if self._any_local(peers) else tensor
        sending = self.comm.broadcast((_TAG, seq, payload), self.group, peers, async_op=True)
        terms: dict[int, torch.Tensor] = {}
        for r in peers:
            msg = self.comm.recv(self.group, r)
            if not (isinstance(msg, tuple) and len(msg) == 3 and msg[:2] == (_TAG, seq)):
                raise CommError(f"sum #{seq} of {self.group}[{self.rank}]: rank {r} sent something else "
                                f"({type(msg).__name__}); the ranks must call the sum in the same order")
            value = msg[2]
            if value.shape != tensor.shape or value.dtype != tensor.dtype:
                raise CommError(f"sum #{seq} of {self.group}: rank {r} sent {value.dtype}{tuple(value.shape)}, "
                                f"rank {self.rank} has {tensor.dtype}{tuple(tensor.shape)}")
            terms[r] = value
        assert sending is not None
        sending.wait()  # the tensor is read by the transport until then
        if self.world_size == 2:
            tensor.add_(terms[peers[0]])
            return
        terms[self.rank] = tensor
        total = terms[0] + terms[1]
        for r in range(2, self.world_size):
            total.add_(terms[r])
        tensor.copy_(total)

