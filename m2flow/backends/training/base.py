"""The training-strategy interface: how a model's gradients are accumulated and reduced across ranks.

A strategy wraps one module on one rank. The training loop runs forward/backward per micro-batch
inside ``accumulate(last=...)``, then calls ``reduce_gradients(scale)`` once, clips and steps. Losses
are summed, not averaged, over micro-batches and ranks; ``scale`` (1 / the global count of tokens or
sequences) turns the sum into the mean, so the result does not depend on how data was split.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import nn

from m2flow.backends.training.registry import STRATEGIES, register_strategy  # noqa: F401  (re-exported)

StrategyName = Literal["ddp", "fsdp"]


@runtime_checkable
class TrainingStrategy(Protocol):
    """One rank's view of a data-parallel model."""

    module: nn.Module
    """The module to run forward passes on (possibly sharded)."""
    rank: int
    world_size: int
    lockstep: bool
    """True when every forward pass is a collective: all ranks must run the same number of micro-batches."""
    sharded: bool
    """True when each rank holds a shard of the state: checkpoints are written per rank (``sharded_state``)
    instead of gathered (``full_state_dict``)."""

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trainable parameters (local shards under FSDP), for the optimizer."""
        ...

    def accumulate(self, last: bool) -> AbstractContextManager[None]:
        """Context for one micro-batch's forward and backward; ``last`` marks the final one of a step."""
        ...

    def reduce_gradients(self, scale: float) -> None:
        """Make every rank's gradient ``scale`` x the sum of all ranks' accumulated gradients."""
        ...

    def clip_grad_norm(self, max_norm: float | None) -> float:
        """Clip the global gradient norm (when ``max_norm`` is set); returns the norm before clipping."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights by name; a collective under FSDP (every rank calls, rank 0 gets them)."""
        ...

    def optim_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Optimizer state to save; complete on rank 0 (a collective under FSDP)."""
        ...

    def load_optim_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Restore what ``optim_state_dict`` returned on rank 0; every rank passes the same state."""
        ...

    def offload(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Move weights, gradients and optimizer state to host memory (nothing to do on CPU)."""
        ...

    def onload(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Bring what ``offload`` moved back onto the device."""
        ...


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every tensor of the optimizer's state (Adam moments...) to ``device``."""
    for state in optimizer.state.values():
        for key, value in state.items():
            # Adam keeps its step count as a host scalar unless capturable; it must stay there.
            if key == "step":
                continue
            if isinstance(value, torch.Tensor) and value.device != torch.device(device):
                state[key] = value.to(device, non_blocking=True)
