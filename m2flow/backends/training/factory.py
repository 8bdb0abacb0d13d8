"""Choosing a training strategy by its config name (``actor.strategy``): the only place that does.

A built-in strategy's module is imported when it is first asked for; what a strategy is (``sharded``,
``lockstep``) is read from ``registry.strategy_traits`` without importing it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from m2flow.backends.training.base import TrainingStrategy
from m2flow.backends.training.registry import STRATEGIES

__all__ = ["create_strategy", "strategy_class"]


def strategy_class(name: str) -> type:
    """The strategy class registered as ``name`` (its module imported first for a built-in one), without
    building one."""
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
