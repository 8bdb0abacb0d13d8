"""What the reasoning workers share: device turns, seeds, weight receipt and weight digests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from m2flow.runtime.comm import recv_weights
from m2flow.runtime.worker import Worker


def derive_seed(*parts: int) -> int:
    """A 31-bit seed determined by ``parts`` (e.g. run seed, step, rank, chunk), well mixed."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes of a state dict: equal iff bit-identical."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class ReasoningWorker(Worker):
    """A worker of the reasoning workflow that may share its devices with other components."""

    shares_devices: bool = False
    """Set from the plan: another component runs on some of this rank's devices."""
    offloads: bool = False
    """Set from the plan: the state goes to host memory after the iteration's last turn on shared devices."""

    @contextmanager
    def turn(self, last: bool = True) -> Iterator[None]:
        """Hold this rank's devices for a block (the device lock), bringing the state on first.

        When the plan says so (shared devices), the memory is given back (offload) after the ``last`` turn of
        the iteration only: between turns the lock is released, so other components can run, but
        the state stays resident instead of moving to the host and back for every micro-batch.
        """
        with self.device_turn(offload_after=self.offloads and last):
            yield

    def receive_weights_into(self, module: nn.Module, src_group: str, src_rank: int = 0) -> int:
        """Copy the weights streamed by ``src_group[src_rank]`` into ``module`` in place; returns how many."""
        with self.tracer.span("receive_weights", cat="weight_sync"), torch.no_grad():
            received = recv_weights(self.comm, src_group, src_rank, into=module)
        return len(received)
