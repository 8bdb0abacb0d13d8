"""Host-side collectives of the training ranks (counts, metrics, barriers, host gradients).

Training ranks agree on counts and wait for each other on a gloo group, whatever the device backend:
these calls move a few floats, and must not need the accelerator, which another collocated component
may be holding at that moment. Without an initialised process group (one rank) they are identities.

Sums of host tensors (counts, and the gradients of CPU ranks) go through ``sum_in_place``, which uses
the function given to ``use_host_sum`` when there is one (the workers install the communicator's
exchange, faster than gloo between a few ranks of one node) and a gloo all-reduce otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

_CONTROL: dict[int, object] = {}
_HOST_SUM: Callable[[torch.Tensor], None] | None = None


def use_host_sum(fn: Callable[[torch.Tensor], None] | None) -> None:
    """Sum host tensors over the ranks with ``fn`` (in place, same result on every rank); None: gloo."""
    global _HOST_SUM
    _HOST_SUM = fn


def sum_in_place(tensor: torch.Tensor) -> None:
    """Replace ``tensor`` by its sum over all ranks (host tensors: ``use_host_sum``'s function or gloo;
    device tensors: the default group's backend)."""
    if not is_distributed():
        return
    if tensor.device.type == "cpu":
        if _HOST_SUM is not None:
            _HOST_SUM(tensor)
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=control_group())
    else:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def control_group() -> object | None:
    """A gloo group over all ranks (the default group when it is gloo already); None when not distributed."""
    if not is_distributed():
        return None
    if dist.get_backend() == "gloo":
        return None  # None means the default group to torch.distributed calls
    key = id(dist.group.WORLD)
    if key not in _CONTROL:
        _CONTROL[key] = dist.new_group(backend="gloo")
    return _CONTROL[key]


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64 on the host)."""
    out = torch.tensor(list(values), dtype=torch.float64)
    if len(values):
        sum_in_place(out)
    return out.tolist()


def all_reduce_max(values: Sequence[float]) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks."""
    out = torch.tensor(list(values), dtype=torch.float64)
    if is_distributed() and len(values):
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=control_group())
    return out.tolist()


def barrier() -> None:
    """Wait until every rank got here (host-side; holds no device)."""
    if is_distributed():
        dist.barrier(group=control_group())
