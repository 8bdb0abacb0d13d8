"""A module's parameters in one flat buffer, and Adam on that buffer.

On small policies a PPO minibatch step is bound by the number of tensor operations it dispatches,
so the update keeps every parameter and every gradient as a view into one of two flat buffers:
one all-reduce and one clipping norm per step, and Adam as a handful of in-place operations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class FlatParameters:
    """A module's trainable parameters and their gradients as views into two flat buffers.

    Autograd accumulates into an existing ``.grad`` in place, so gradients land in the flat buffer
    as long as nobody sets them to ``None``: use :meth:`zero_grad`, never ``module.zero_grad()``.
    """

    def __init__(self, module: nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no trainable parameters")
        total = sum(p.numel() for p in params)
        first = params[0]
        flat = torch.empty(total, dtype=first.dtype, device=first.device)
        grad = torch.zeros_like(flat)
        layout, offset = [], 0
        for p in params:
            layout.append((offset, p.numel(), tuple(p.shape)))
            offset += p.numel()
        self.layout: tuple[tuple[int, int, tuple[int, ...]], ...] = tuple(layout)
        """(offset, size, shape) of each parameter in the buffers, in ``params`` order."""
        for p, (o, n, _) in zip(params, self.layout):
            flat[o : o + n].copy_(p.detach().reshape(-1))
            p.data = flat[o : o + n].view_as(p)
            p.grad = grad[o : o + n].view_as(p)
        self.params = params
        self.param = nn.Parameter(flat)  # shares the storage of flat: an update of it moves the module
        self.param.grad = grad

    @property
    def grad(self) -> Tensor:
        return self.param.grad  # type: ignore[return-value]

    def zero_grad(self) -> None:
        self.grad.zero_()

    def to(self, device: torch.device | str) -> None:
        """Move both buffers (context switching) and point the module's tensors at the moved ones."""
        device = torch.device(device)
        if self.param.device == device:
            return
        grad = self.grad.to(device)
        self.param.data = self.param.data.to(device)
        self.param.grad = grad
        for p, (o, n, _) in zip(self.params, self.layout):
            p.data = self.param.data[o : o + n].view_as(p)
            p.grad = grad[o : o + n].view_as(p)


class FlatAdam:
    """Adam (Kingma & Ba 2015) on one flat parameter: the update of ``torch.optim.Adam``, op for op.

    ``torch.optim.Adam.step`` spends far more time in Python bookkeeping than in its fused kernel
    when there is a single small tensor to update, and that is paid on every minibatch.
    """

    def __init__(self, param: nn.Parameter, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.param = param
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.step_count = 0
        self.exp_avg = torch.zeros_like(param, memory_format=torch.preserve_format).detach()
        self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        # 0-dim tensors: arithmetic with Python floats would wrap and convert them on every step
        self._beta2 = torch.full((), self.betas[1], dtype=param.dtype, device=param.device)
        self._eps = torch.zeros((), dtype=param.dtype, device=param.device)

    def scalars(self, step: int) -> tuple[float, float]:
        """The step size and epsilon of update number ``step`` (from 1), bias corrections folded in.

        With b1 = 1 - beta1^t and b2 = sqrt(1 - beta2^t), ``sqrt(v) / b2 + eps`` is written as
        ``(sqrt(v) + eps * b2) / b2`` and the ``1 / b2`` goes into the step size ``lr * b2 / b1``.
        """
        beta1, beta2 = self.betas
        bias1 = 1.0 - beta1**step
        bias2_sqrt = math.sqrt(1.0 - beta2**step)
        return self.lr * bias2_sqrt / bias1, self.eps * bias2_sqrt

    @torch.no_grad()
    def step(self) -> None:
        """One update of ``param`` from ``param.grad``."""
        beta1, beta2 = self.betas
        grad = self.param.grad
        self.step_count += 1
        self.exp_avg.lerp_(grad, 1.0 - beta1)
        self.exp_avg_sq.mul_(self._beta2).addcmul_(grad, grad, value=1.0 - beta2)
        step_size, eps = self.scalars(self.step_count)
        self._eps.fill_(eps)
        denom = torch.sqrt(self.exp_avg_sq).add_(self._eps)
        self.param.addcdiv_(self.exp_avg, denom, value=-step_size)

    def to(self, device: torch.device | str) -> None:
        self.exp_avg = self.exp_avg.to(device)
        self.exp_avg_sq = self.exp_avg_sq.to(device)
        self._beta2 = self._beta2.to(device)
        self._eps = self._eps.to(device)

    def state_dict(self) -> dict:
        return {"step": self.step_count, "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(),
                "lr": self.lr, "betas": self.betas, "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        if state["exp_avg"].shape != self.exp_avg.shape:
            raise ValueError(f"optimizer state for {tuple(state['exp_avg'].shape)} parameters, "
                             f"this model has {tuple(self.exp_avg.shape)}")
        self.step_count = int(state["step"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.lr, self.betas, self.eps = state["lr"], tuple(state["betas"]), state["eps"]
