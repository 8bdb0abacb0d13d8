"""Data parallelism with replicated weights (the DDP scheme), gradients reduced once per step.

Gradients accumulate locally over all micro-batches of a step and are all-reduced once before the
optimizer step, as ``DistributedDataParallel`` does with ``no_sync()`` followed by a synced backward.
The reduction is done here rather than inside backward so that ranks may run different numbers of
micro-batches: with elastic micro-batching each rank takes what is ready, and a DDP backward hook
would deadlock as soon as one rank has one micro-batch fewer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from m2flow.backends.training.base import move_optimizer_state, register_strategy
from m2flow.backends.training.collectives import is_distributed, sum_in_place

_BUCKET_BYTES = 32 << 20


@register_strategy("ddp")
class DataParallelStrategy:
    """Every rank holds the full model; gradients are summed over ranks in flat buckets."""

    # lockstep, sharded: declared in registry.py (read before this module is imported)

    def __init__(self, module: nn.Module, device: torch.device, bucket_bytes: int = _BUCKET_BYTES) -> None:
        self.module = module
        self.device = device
        self.bucket_bytes = bucket_bytes
        self.distributed = is_distributed()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        if self.distributed:
            # Replicas must start identical (a freshly initialised value head would not be).
            with torch.no_grad():
                for tensor in list(module.parameters()) + list(module.buffers()):
                    dist.broadcast(tensor.data, src=0)

    def parameters(self) -> Iterator[nn.Parameter]:
        # Listed once: walking the module tree costs more than a small model's optimizer step.
        # The optimizer is built over this same list, so later requires_grad changes are ignored.
        if not hasattr(self, "_trainable"):
            self._trainable = [p for p in self.module.parameters() if p.requires_grad]
        return iter(self._trainable)

    def accumulate(self, last: bool) -> AbstractContextManager[None]:
        del last  # reduction happens in reduce_gradients, never inside backward
        return nullcontext()

    def reduce_gradients(self, scale: float) -> None:
        params = list(self.parameters())
        for p in params:
            if p.grad is None:  # a parameter no micro-batch reached still takes part in the sum
                p.grad = torch.zeros_like(p)
        if self.distributed:
            for bucket in self._buckets([p.grad for p in params]):
                flat = torch.cat([g.reshape(-1) for g in bucket])
                sum_in_place(flat)
                offset = 0
                for g in bucket:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()
        if scale != 1.0:
            torch._foreach_mul_([p.grad for p in params], scale)  # one call, not one op per tensor

    def _buckets(self, grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            nbytes = g.numel() * g.element_size()
            # One dtype per bucket: torch.cat would silently upcast a mixed one.
            if bucket and (size + nbytes > self.bucket_bytes or g.dtype != bucket[0].dtype):
                yield bucket
                bucket, size = [], 0
            bucket.append(g)
            size += nbytes
        if bucket:
            yield bucket

    def clip_grad_norm(self, max_norm: float | None) -> float:
        params = [p for p in self.parameters() if p.grad is not None]
        if max_norm is None:
            norms = torch.stack([p.grad.detach().float().norm() for p in params]) if params else torch.zeros(1)
            return float(norms.norm())
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.module.state_dict().items()}

    def optim_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optim_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)

    def offload(self, optimizer: torch.optim.Optimizer | None) -> None:
        if self.device.type == "cpu":
            return
        self.module.to("cpu")
        if optimizer is not None:
            move_optimizer_state(optimizer, "cpu")

    def onload(self, optimizer: torch.optim.Optimizer | None) -> None:
        if self.device.type == "cpu":
            return
        self.module.to(self.device)
        if optimizer is not None:
            move_optimizer_state(optimizer, self.device)
