"""Per-token KL(policy || reference) estimators, for a loss term or a reward penalty.

From samples of the policy, with x = log pi(a) - log pi_ref(a) (Schulman, "Approximating KL
Divergence", 2020, joschu.net/blog/kl-approx.html):
- ``k1`` = x: unbiased, high variance, can be negative;
- ``k2`` = x^2 / 2: biased, low variance, its gradient is that of the true KL on-policy;
- ``k3`` = exp(-x) - 1 + x: unbiased, low variance, never negative.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from m2flow.algorithms.aggregation import AggMode, aggregate
from m2flow.algorithms.losses import LossOutput, clean
from m2flow.algorithms.masked import masked_mean
from m2flow.algorithms.registry import KL_ESTIMATORS

# exp(-x) for |x| past ~20 is either 0-ish or overflows towards inf in fp16/bf16; tokens that far
# apart carry no useful gradient, so the log ratio is clamped first.
_MAX_LOG_RATIO = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """(B, L) k1 = log pi - log pi_ref."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2")
def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """(B, L) k2 = 0.5 * (log pi - log pi_ref)^2."""
    return 0.5 * (log_probs - ref_log_probs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """(B, L) k3 = exp(-x) - 1 + x with x = log pi - log pi_ref (clamped to +-20)."""
    x = (log_probs - ref_log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(-x) + x


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "k3") -> Tensor:
    """(B, L) per-token KL estimate of the named kind (see ``KL_ESTIMATORS.names()``)."""
    return KL_ESTIMATORS.get(kind)(log_probs, ref_log_probs)


def kl_loss(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    mask: Tensor,
    *,
    kind: str = "k3",
    agg: AggMode | str = "token-mean",
    **agg_kwargs: Any,
) -> LossOutput:
    """Scalar KL loss term (multiply by its coefficient) and metrics, from (B, L) log-probs."""
    log_probs, ref_log_probs = clean(mask, log_probs, ref_log_probs)
    per_token = kl_estimate(log_probs, ref_log_probs, kind)
    loss = aggregate(per_token, mask, agg, **agg_kwargs)
    k1 = masked_mean((log_probs - ref_log_probs).detach(), mask)
    return LossOutput(loss, {"actor/kl_loss": loss.detach(), "actor/kl_k1": k1})


def kl_penalty(
    log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor, *, coef: float, kind: str = "k1"
) -> Tensor:
    """(B, L) coef * KL per response token (0 on padding), to subtract from token rewards."""
    per_token = kl_estimate(log_probs.detach(), ref_log_probs.detach(), kind)
    return torch.where(mask.bool(), coef * per_token, torch.zeros_like(per_token))
