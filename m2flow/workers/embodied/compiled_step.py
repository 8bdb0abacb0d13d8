"""The PPO minibatch step of an MLP actor-critic as compiled code (``actor.compile``).

On CPU a minibatch step of a (64, 64) MLP is bound by the cost of dispatching some sixty small
tensor operations, not by its arithmetic. ``torch.compile`` turns the closed-form gradient
(``closed_form.minibatch_gradient``), the gradient-norm clip and the Adam update into one piece of
generated C++ per minibatch shape, called once per minibatch.

The compiled functions take the flat parameter buffer and slice the layers out of it themselves:
the parameters are views of that buffer, and compiled code may not be handed views of a tensor it
writes. The parameters, Adam's moments and (with several ranks) the gradient are updated in place,
so checkpoints, weight sync and the eager path see the same tensors.

Two forms: one function for the whole step (one rank, no ``target_kl``), and a gradient function
plus an update function with the all-reduce (or the KL check) between them. The numbers are those
of the eager step up to float rounding (Adam's step size is a tensor here, a Python float there).
If compiling fails, the updater logs why and trains eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from m2flow.models.compile_cache import cache_per_float_path
from m2flow.workers.embodied.closed_form import Constants, GradList, Net, minibatch_gradient

log = logging.getLogger(__name__)

# One (offset, size, shape) per parameter, in the flat buffer's order (``FlatParameters.layout``).
Layout = tuple[tuple[int, int, tuple[int, ...]], ...]


def _views(flat: Tensor, layout: Layout) -> list[Tensor]:
    return [flat[o : o + n].view(shape) for o, n, shape in layout]


def _gradient(net: Net, layout: Layout, flat: Tensor, k: Constants, obs: Tensor, actions: Tensor, offset: Tensor,
              neg_adv: Tensor, returns: Tensor, value_factor: Tensor, entropy_slope: float) -> tuple[Tensor, Tensor]:
    """(flat gradient, metric parts) of one minibatch share."""
    sink = GradList(len(layout))
    parts = minibatch_gradient(net, _views(flat, layout), sink, k, obs, actions, offset, neg_adv, returns,
                               value_factor, entropy_slope)
    return torch.cat([g.reshape(-1) for g in sink.grads]), parts


def _clip_and_adam(flat: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step_size: Tensor,
                   eps: Tensor, max_norm: float, betas: tuple[float, float]) -> None:
    """Clip ``grad`` to ``max_norm`` (0: no clip), then ``FlatAdam.step`` with its per-step scalars as tensors."""
    if max_norm > 0:
        grad = grad * torch.clamp(max_norm / (torch.linalg.vector_norm(grad) + 1e-6), max=1.0)
    exp_avg.lerp_(grad, 1.0 - betas[0])
    exp_avg_sq.mul_(betas[1]).addcmul_(grad, grad, value=1.0 - betas[1])
    flat.sub_(step_size * exp_avg / (torch.sqrt(exp_avg_sq) + eps))


class CompiledStep:
    """Compiled minibatch steps for one policy layout; ``fused`` does gradient and update in one call."""

    def __init__(self, net: Net, layout: Layout, max_norm: float, betas: tuple[float, float], fused: bool) -> None:
        self.fused = fused
        self.failure: str | None = None
        """Why compiling was given up (None: it was not)."""
        # C++ calling code instead of Python: ~15% less per call at this size
        options: dict[str, Any] = {"fullgraph": True, "dynamic": False, "options": {"cpp_wrapper": True}}
        betas = (float(betas[0]), float(betas[1]))
        cache_per_float_path()

        def gradient(*args: Any) -> tuple[Tensor, Tensor]:
            return _gradient(net, layout, *args)

        def update(flat: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step_size: Tensor,
                   eps: Tensor) -> None:
            _clip_and_adam(flat, grad, exp_avg, exp_avg_sq, step_size, eps, max_norm, betas)

        def whole(flat: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step_size: Tensor, eps: Tensor,
                  *args: Any) -> Tensor:
            grad, parts = _gradient(net, layout, flat, *args)
            _clip_and_adam(flat, grad, exp_avg, exp_avg_sq, step_size, eps, max_norm, betas)
            return parts

        self._whole: Callable[..., Tensor] | None = torch.compile(whole, **options) if fused else None
        self._gradient: Callable[..., tuple[Tensor, Tensor]] | None = (
            None if fused else torch.compile(gradient, **options))
        self._update: Callable[..., None] | None = None if fused else torch.compile(update, **options)

    @property
    def active(self) -> bool:
        """Whether steps still run compiled."""
        return self.failure is None

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: train eagerly from now on
            self.failure = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("compiled PPO step failed (%s); training eagerly instead", self.failure)
            return None

    def whole(self, *args: Any) -> Tensor | None:
        """Gradient, clip and Adam of one minibatch; the metric parts, or None if compiling failed."""
        assert self._whole is not None
        return self._guard(self._whole, *args)

    def gradient(self, *args: Any) -> tuple[Tensor, Tensor] | None:
        """(flat gradient, metric parts) of one minibatch share, or None if compiling failed."""
        assert self._gradient is not None
        return self._guard(self._gradient, *args)

    def update(self, *args: Any) -> bool:
        """Clip and Adam from a (summed) gradient; False if compiling failed (nothing was changed)."""
        assert self._update is not None
        self._guard(self._update, *args)
        return self.active

