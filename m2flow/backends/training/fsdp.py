"""Fully sharded data parallelism with torch's FSDP2 (``fully_shard``), on gloo (CPU) or NCCL.

Each transformer block (the classes a Hugging Face model lists in ``_no_split_modules``) is its own
shard unit, then the root. Forward passes all-gather weights, so ranks run micro-batches in lockstep
(``lockstep = True``); gradient sync is switched off for all but the last micro-batch of a step.
``cpu_offload`` keeps parameters in host memory between uses (FSDP's own offload policy); then
``offload``/``onload`` have only the optimizer state left to move.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from m2flow.backends.training.base import move_optimizer_state, register_strategy


def _block_classes(module: nn.Module) -> set[str]:
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return names


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@register_strategy("fsdp")
class FSDP2Strategy:
    """Parameters, gradients and optimizer state sharded over the ranks of the group."""

    # lockstep, sharded: declared in registry.py (read before this module is imported)

    def __init__(self, module: nn.Module, device: torch.device, cpu_offload: bool = False) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("the fsdp strategy needs an initialised process group (init_process_group)")
        self.device = device
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.cpu_offload = cpu_offload
        mesh = init_device_mesh(device.type, (self.world_size,))
        policy = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
        blocks = _block_classes(module)
        for sub in module.modules():
            if sub is not module and type(sub).__name__ in blocks:
                fully_shard(sub, mesh=mesh, offload_policy=policy)
        fully_shard(module, mesh=mesh, offload_policy=policy)
        self.module = module

    def parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.module.parameters() if p.requires_grad)

    def accumulate(self, last: bool) -> AbstractContextManager[None]:
        @contextmanager
        def ctx() -> Iterator[None]:
            self.module.set_requires_gradient_sync(last)  # type: ignore[operator]
            yield

        return ctx()

    def reduce_gradients(self, scale: float) -> None:
        # The synced backward reduce-scattered the gradients as a mean over ranks: undo the 1/W.
        factor = scale * self.world_size
        for p in self.parameters():
            if p.grad is not None and factor != 1.0:
                p.grad.mul_(factor)

    def clip_grad_norm(self, max_norm: float | None) -> float:
        params = [p for p in self.parameters() if p.grad is not None]
        if max_norm is None:
            max_norm = float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(_local(norm))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optim_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optim_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        # torch builds the local state to fill by a zero step, which it skips while gradients exist.
        optimizer.zero_grad(set_to_none=True)
        set_optimizer_state_dict(self.module, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def sharded_state(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """This rank's shards of the weights and optimizer state (DTensors, nothing gathered), and the
        optimizer's param groups (plain values, the same on every rank)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        # torch builds the optimizer's state by a zero step when it has none yet, which gradients block.
        if not optimizer.state:
            optimizer.zero_grad(set_to_none=True)
        model, optim = get_state_dict(self.module, optimizer)
        return {"model": model, "optim": optim["state"]}, optim["param_groups"]

    def load_sharded_state(self, optimizer: torch.optim.Optimizer, tensors: dict[str, Any],
                           param_groups: list[dict[str, Any]]) -> None:
        """Restore what ``sharded_state`` returned (the tensors as loaded into its own tree)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.module, optimizer, model_state_dict=tensors["model"],
                       optim_state_dict={"state": tensors["optim"], "param_groups": param_groups})

    def offload(self, optimizer: torch.optim.Optimizer | None) -> None:
        if self.device.type != "cpu" and optimizer is not None:
            move_optimizer_state(optimizer, "cpu")

    def onload(self, optimizer: torch.optim.Optimizer | None) -> None:
        if self.device.type != "cpu" and optimizer is not None:
            move_optimizer_state(optimizer, self.device)
