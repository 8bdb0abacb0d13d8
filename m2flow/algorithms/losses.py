"""Policy, value and entropy losses over (B, L) tokens (or (T, N) steps: any 2-D layout with a mask).

Masked-out entries are replaced by 0 before any arithmetic, not only left out of the sum: a NaN
or inf in padding (a -inf log-prob, an uninitialised value) would otherwise turn into a NaN
gradient through ``0 * nan``.

Every loss returns a ``LossOutput``: the scalar to minimise and detached scalar metrics named by
prefix (``actor/``, ``critic/``). Policy losses share one call shape,
``fn(log_probs, old_log_probs, advantages, mask, *, agg=..., **params)``, and are registered in
``POLICY_LOSSES``; ``decoupled_ppo`` also takes the tokens' ``behaviour_log_probs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from m2flow.algorithms.aggregation import AggMode, aggregate
from m2flow.algorithms.masked import masked_mean
from m2flow.algorithms.offpolicy import decoupled_ppo_weights
from m2flow.algorithms.registry import POLICY_LOSSES

# exp() of a log ratio beyond this overflows or is meaningless; such tokens are clipped anyway.
_MAX_LOG_RATIO = 20.0


@dataclass
class LossOutput:
    """A scalar loss to minimise and detached scalar metrics."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


def clean(mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """The tensors with masked-out entries set to 0 (forward and backward free of their values)."""
    keep = mask.bool()
    return tuple(torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)) for x in tensors)


def _ratio_metrics(log_ratio: Tensor, ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    log_ratio, ratio = log_ratio.detach(), ratio.detach()
    return {
        # k3 estimate of KL(old || new) from samples of the old policy (Schulman's note).
        "actor/approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
        "actor/ratio_mean": masked_mean(ratio, mask),
    }


@POLICY_LOSSES.register("ppo")
def ppo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    clip_c: float | None = None,
    agg: AggMode | str = "token-mean",
    **agg_kwargs: Any,
) -> LossOutput:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347); all tensors (B, L).

    The ratio is clipped to [1 - clip_low, 1 + clip_high]; ``clip_high > clip_low`` is DAPO's
    clip-higher (Yu et al. 2025). ``clip_c > 1`` adds dual-clip (Ye et al. 2020, arXiv 1912.09729):
    for negative advantages the loss is capped at -A * clip_c, so a huge ratio cannot blow it up.
    """
    clip_high = clip_low if clip_high is None else clip_high
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
    log_probs, old_log_probs, advantages = clean(mask, log_probs, old_log_probs, advantages)
    log_ratio = (log_probs - old_log_probs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    metrics = _ratio_metrics(log_ratio, ratio, mask)
    metrics["actor/clip_frac"] = masked_mean((clipped > unclipped).float(), mask)
    if clip_c is not None:
        capped = torch.minimum(per_token, -advantages * clip_c)
        dual = (advantages < 0) & (capped < per_token)
        per_token = torch.where(advantages < 0, capped, per_token)
        metrics["actor/dual_clip_frac"] = masked_mean(dual.float(), mask)
    loss = aggregate(per_token, mask, agg, **agg_kwargs)
    metrics["actor/pg_loss"] = loss.detach()
    return LossOutput(loss, metrics)


@POLICY_LOSSES.register("decoupled_ppo")
def decoupled_ppo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    behaviour_log_probs: Tensor | None = None,
    behaviour_weight_cap: float | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    clip_c: float | None = None,
    agg: AggMode | str = "token-mean",
    **agg_kwargs: Any,
) -> LossOutput:
    """Decoupled PPO over tokens sampled by policies of mixed versions (Hilton et al. 2021, arXiv
    2110.00641; AReaL, Fu et al. 2025, arXiv 2505.24298); all tensors (B, L).

    ``old_log_probs`` are the proximal policy's (the learner's weights at the update's start): the ratio
    ``pi_theta / pi_prox`` is clipped against them as in ``ppo``. ``behaviour_log_probs`` are the log-probs
    each token was sampled with (its own weight version's); each token's advantage is weighted by
    ``w = pi_prox / pi_behav``, detached, truncated at ``behaviour_weight_cap`` (None: no cap) -- the
    weights of ``offpolicy.decoupled_ppo_weights``. Since ``w > 0``, ``w * min(r A, clip(r) A)`` is the
    ``ppo`` surrogate with advantage ``w A``, which is how it is computed (dual-clip included). None, or
    behaviour equal to proximal (fresh tokens): ``w = 1``, plain ``ppo``.
    """
    old_log_probs = old_log_probs.detach()  # the proximal policy is a constant of the update
    weights = torch.ones_like(advantages)
    if behaviour_log_probs is not None:
        proximal, behaviour = clean(mask, old_log_probs, behaviour_log_probs)
        log_weight = (proximal - behaviour).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # exp() must not overflow
        weights = decoupled_ppo_weights(log_weight, torch.zeros_like(log_weight), cap=behaviour_weight_cap)
    out = ppo_policy_loss(log_probs, old_log_probs, advantages * weights, mask, clip_low=clip_low,
                          clip_high=clip_high, clip_c=clip_c, agg=agg, **agg_kwargs)
    out.metrics["async/importance_weight_mean"] = masked_mean(weights.detach(), mask)
    return out


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: AggMode | str = "token-mean",
    **agg_kwargs: Any,
) -> LossOutput:
    """Plain policy gradient -A * log pi (Williams 1992), (B, L); old_log_probs feed metrics only."""
    log_probs, old_log_probs, advantages = clean(mask, log_probs, old_log_probs, advantages)
    per_token = -advantages * log_probs
    log_ratio = (log_probs - old_log_probs).detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    metrics = _ratio_metrics(log_ratio, log_ratio.exp(), mask)
    loss = aggregate(per_token, mask, agg, **agg_kwargs)
    metrics["actor/pg_loss"] = loss.detach()
    return LossOutput(loss, metrics)


def policy_loss(
    name: str, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, **params: Any
) -> LossOutput:
    """Run the policy loss registered as ``name`` (see ``POLICY_LOSSES.names()``)."""
    return POLICY_LOSSES.get(name)(log_probs, old_log_probs, advantages, mask, **params)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float | None = None,
    agg: AggMode | str = "token-mean",
    **agg_kwargs: Any,
) -> LossOutput:
    """0.5 * (V - R)^2 over (B, L), optionally PPO-clipped around the old values.

    With ``clip_range`` the loss is the larger of the unclipped error and the error of
    old + clamp(V - old, -clip_range, clip_range), as in the PPO reference implementation.
    """
    values, old_values, returns = clean(mask, values, old_values, returns)
    error = (values - returns) ** 2
    metrics: dict[str, Tensor] = {}
    if clip_range is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
        clipped_error = (clipped_values - returns) ** 2
        metrics["critic/clip_frac"] = masked_mean((clipped_error > error).float(), mask)
        error = torch.maximum(error, clipped_error)
    loss = 0.5 * aggregate(error, mask, agg, **agg_kwargs)
    metrics["critic/value_loss"] = loss.detach()
    metrics["critic/value_mean"] = masked_mean(values.detach(), mask)
    return LossOutput(loss, metrics)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """(...,) entropy of the categorical distribution given by logits (..., V)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def entropy_bonus(
    entropy: Tensor, mask: Tensor, *, coef: float, agg: AggMode | str = "token-mean", **agg_kwargs: Any
) -> LossOutput:
    """Loss term -coef * aggregated entropy (B, L): minimising it raises entropy."""
    (entropy,) = clean(mask, entropy)
    mean_entropy = aggregate(entropy, mask, agg, **agg_kwargs)
    return LossOutput(-coef * mean_entropy, {"actor/entropy": mean_entropy.detach()})
