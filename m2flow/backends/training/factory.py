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

__all__ = ["create_strategy"]


def create_strategy(name: str, module: nn.Module, device: torch.device | str, **kwargs: Any) -> TrainingStrategy:
    """Wrap ``module`` (already on ``device``) with the strategy registered as ``name``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown training strategy {name!r}; valid: {sorted(STRATEGIES)}")
    return STRATEGIES[name](module, torch.device(device), **kwargs)
