"""A model being trained: its data-parallel strategy, optimizer and schedule, and one update step."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from m2flow.backends.training import sharded_checkpoint
from m2flow.backends.training import OptimConfig, build_optimizer, build_scheduler, create_strategy
from m2flow.runtime.trace import get_tracer

log = logging.getLogger(__name__)


class TrainedModel:
    """``module`` wrapped by strategy ``strategy`` with the optimizer and lr schedule of ``optim``."""

    def __init__(self, module: nn.Module, strategy: str, device: torch.device, optim: OptimConfig,
                 total_steps: int, *, cpu_offload: bool = False) -> None:
        self.strategy = create_strategy(strategy, module, device, cpu_offload=cpu_offload)
        self.optim_cfg = optim
        self.optimizer = build_optimizer(self.strategy.parameters(), optim)
        self.scheduler = build_scheduler(self.optimizer, optim, total_steps)
        self.module.train()

    @property
    def module(self) -> nn.Module:
        return self.strategy.module

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def apply_update(self, scale: float, loss_finite: bool = True) -> dict[str, float]:
        """Reduce the accumulated gradients x ``scale`` over ranks, clip, step; a non-finite loss
        (``loss_finite`` False, the same on every rank: it comes from summed totals) or gradient norm
        skips the step, leaving weights and optimizer state as they were."""
        with get_tracer().span("reduce_gradients", cat="train"):
            self.strategy.reduce_gradients(scale)
        norm = self.strategy.clip_grad_norm(self.optim_cfg.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        skipped = not (loss_finite and math.isfinite(norm))
        if skipped:
            log.warning("%s: skipping this optimizer step",
                        "the loss is not finite" if not loss_finite else f"the gradient norm is {norm}")
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.zero_grad()
        return {"grad_norm": norm if not skipped else float("nan"), "lr": lr, "skipped": float(skipped)}

    def offload(self) -> None:
        self.strategy.offload(self.optimizer)

    def onload(self) -> None:
        self.strategy.onload(self.optimizer)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights (a collective under FSDP; complete on rank 0)."""
        return self.strategy.full_state_dict()

    def training_state(self) -> dict[str, Any]:
        """Optimizer and schedule state to checkpoint (a collective under FSDP; complete on rank 0)."""
        return {"optimizer": self.strategy.optim_state_dict(self.optimizer), "scheduler": self.scheduler.state_dict()}

    @property
    def sharded(self) -> bool:
        """Whether checkpoints are written per rank (``save_sharded``) rather than gathered."""
        return self.strategy.sharded

    def save_sharded(self, path: Path) -> dict[str, Any]:
        """Write this rank's shards of weights and optimizer state under ``path`` (every rank calls; nothing is
        gathered); returns the plain part (param groups, schedule) for the caller to save."""
        tensors, param_groups = self.strategy.sharded_state(self.optimizer)  # type: ignore[attr-defined]
        sharded_checkpoint.save(path, tensors)
        return {"param_groups": param_groups, "scheduler": self.scheduler.state_dict()}

    def load_sharded(self, path: Path, plain: dict[str, Any]) -> None:
        """Restore what ``save_sharded`` wrote (any number of ranks may have written it)."""
        tensors, _ = self.strategy.sharded_state(self.optimizer)  # type: ignore[attr-defined]
        sharded_checkpoint.load(path, tensors)  # fills this rank's shards in place
        self.strategy.load_sharded_state(self.optimizer, tensors, plain["param_groups"])  # type: ignore[attr-defined]
        self.scheduler.load_state_dict(plain["scheduler"])

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore ``training_state()``; every rank passes the saved state."""
        self.strategy.load_optim_state_dict(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
