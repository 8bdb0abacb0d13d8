"""Choosing a training strategy by its config name (``actor.strategy``): the only place that does.

Importing this module registers the built-in strategies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The built-in strategies register themselves on import.
from m2flow.backends.training import ddp, fsdp  # noqa: F401
from m2flow.backends.training.base import STRATEGIES, TrainingStrategy

__all__ = ["create_strategy", "strategy_class"]


def strategy_class(name: str) -> type:
    """The strategy registered as ``name`` (what it is: ``sharded``, ``lockstep``), without building one."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown training strategy {name!r}; valid: {sorted(STRATEGIES)}")
    return STRATEGIES[name]


def create_strategy(name: str, module: nn.Module, device: torch.device | str, *, cpu_offload: bool = False,
                    **kwargs: Any) -> TrainingStrategy:
    """Wrap ``module`` (already on ``device``) with the strategy registered as ``name``; ``cpu_offload`` is
    passed to a sharded strategy (it keeps its shards in host memory), a replicated one has nothing to offload."""
    cls = strategy_class(name)
    if cls.sharded:
        kwargs["cpu_offload"] = cpu_offload
    return cls(module, torch.device(device), **kwargs)
