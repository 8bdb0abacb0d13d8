"""Optimizer and learning-rate schedule for a trained model, built from one config section."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from m2flow.config.schema import option

if TYPE_CHECKING:  # torch is imported on use, so config sections stay light to import
    import torch

Schedule = Literal["constant", "linear", "cosine"]


@dataclass
class OptimConfig:
    """Optimizer, gradient clipping and learning-rate schedule."""

    name: Literal["adamw", "adam", "sgd"] = option("adamw", "optimizer")
    lr: float = option(1e-5, "peak learning rate")
    weight_decay: float = option(0.0, "decoupled weight decay (adamw) or L2 penalty (adam, sgd)")
    betas: tuple[float, float] = option((0.9, 0.999), "Adam moment decay rates")
    eps: float = option(1e-8, "Adam denominator epsilon")
    momentum: float = option(0.0, "SGD momentum")
    grad_clip: float | None = option(1.0, "clip the global gradient norm to this value (None: no clipping)")
    schedule: Schedule = option("constant", "learning-rate shape after warm-up")
    warmup_steps: int = option(0, "optimizer steps of linear warm-up from 0 to lr")
    min_lr_ratio: float = option(0.0, "the linear/cosine schedules end at lr * min_lr_ratio")
    fused: bool | None = option(
        None, "Adam/AdamW/SGD in torch's fused kernel, one call per step instead of a few ops per tensor "
              "(None: where it applies, i.e. plain float tensors on CPU or CUDA; sharded ones use foreach)")

    def validate(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.name`` over the trainable ``params``."""
    import torch

    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    fused = fused_applies(trainable) if cfg.fused is None else cfg.fused
    if fused and not fused_applies(trainable):
        raise ValueError("optim.fused=true needs plain floating-point parameters on CPU or CUDA")
    kind = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}.get(cfg.name)
    if kind is not None:
        optimizer = kind(trainable, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                         fused=fused or None)
    else:
        optimizer = torch.optim.SGD(trainable, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                    fused=fused or None)
    if fused:
        # torch's fused kernels write the parameters without bumping their version counters, the sign by
        # which a generator over the same model (a fused rollout's FunctionalLM) sees that its weights changed.
        optimizer.register_step_post_hook(lambda opt, args, kwargs: torch.autograd.graph.increment_version(trainable))
    return optimizer


def fused_applies(params: Iterable[torch.nn.Parameter]) -> bool:
    """Whether torch's fused optimizer kernels take these parameters: plain (not sharded) float
    tensors, all on CPU or all on one CUDA device type."""
    import torch

    params = list(params)
    devices = {p.device.type for p in params}
    plain = all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in params)
    return plain and len(devices) == 1 and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params)


def lr_factor(step: int, *, schedule: Schedule, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based).

    Linear warm-up over ``warmup_steps`` (step 0 already gets 1 / warmup_steps, so no step is wasted
    at lr 0), then constant, or linear / cosine decay reaching ``min_lr_ratio`` at ``total_steps``.
    """
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        shape = 1.0 - progress
    elif schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown lr schedule {schedule!r}; valid: constant, linear, cosine")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_factor`; call ``step()`` once per optimizer step."""
    import torch

    def factor(step: int) -> float:
        return lr_factor(step, schedule=cfg.schedule, warmup_steps=cfg.warmup_steps,
                         total_steps=total_steps, min_lr_ratio=cfg.min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
