"""The actor's objective on one micro-batch, as a *sum* whose global denominator is applied later.

Every term is aggregated with ``denominator=1``: token-mean becomes a sum over tokens, the sequence
modes a sum over sequences. The actor adds these sums over micro-batches and ranks and scales the
gradients once by 1 / (global tokens or sequences), so the update equals the one computed on the
whole batch at once, however the batch was cut into micro-batches or spread over ranks.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from torch import Tensor

from m2flow.algorithms import POLICY_LOSSES, entropy_bonus, kl_loss, value_loss
from m2flow.data.batch import RolloutBatch
from m2flow.workers.config import AlgorithmConfig

# Metrics the loss functions report as means over the micro-batch's tokens; they are re-weighted
# by token counts. Everything else a loss reports is a sum-form loss value.
TOKEN_MEANS = frozenset({
    "actor/approx_kl", "actor/ratio_mean", "actor/clip_frac", "actor/dual_clip_frac", "actor/entropy",
    "actor/kl_k1", "critic/value_mean", "critic/clip_frac",
})
# Every metric name an objective can produce, in a fixed order, so ranks can all-reduce them.
METRIC_NAMES = (
    "actor/pg_loss", "actor/kl_loss", "actor/approx_kl", "actor/ratio_mean", "actor/clip_frac",
    "actor/dual_clip_frac", "actor/entropy", "actor/kl_k1", "critic/value_loss", "critic/value_mean",
    "critic/clip_frac",
)


def denominator(mask: Tensor, agg: str) -> float:
    """What ``agg`` divides by on this micro-batch: response tokens (token-mean) or non-empty sequences."""
    if agg == "token-mean":
        return float(mask.bool().sum())
    return float(mask.bool().any(dim=-1).sum())


@dataclass
class Objective:
    """One micro-batch's loss (sum form, to backward) and what it adds to the step's totals."""

    loss: Tensor
    count: float
    tokens: float
    metrics: dict[str, float] = field(default_factory=dict)


def _policy_params(algo: AlgorithmConfig) -> dict[str, object]:
    offered = {"clip_low": algo.clip_low, "clip_high": algo.clip_high, "clip_c": algo.clip_c}
    accepted = inspect.signature(POLICY_LOSSES.get(algo.policy_loss)).parameters
    return {k: v for k, v in offered.items() if k in accepted}


def _collect(metrics: dict[str, float], reported: dict[str, Tensor], tokens: float) -> None:
    for name, value in reported.items():
        v = float(value)
        metrics[name] = metrics.get(name, 0.0) + (v * tokens if name in TOKEN_MEANS else v)


def policy_objective(log_probs: Tensor, entropy: Tensor | None, batch: RolloutBatch, algo: AlgorithmConfig) -> Objective:
    """Policy loss (+ KL and entropy terms) from current log-probs (B, Lr) of ``batch``'s responses.

    Behaviour log-probs come from the batch (inference or rollout) or, when absent, are the detached
    current ones (ratio 1: exact for one optimizer step per iteration).
    """
    mask = batch.response_mask.to(log_probs.device)
    advantages = batch.advantages.to(log_probs.device)
    old = batch.old_logprobs if algo.old_logprobs == "inference" else (
        batch.rollout_logprobs if algo.old_logprobs == "rollout" else None)
    old = log_probs.detach() if old is None else old.to(log_probs.device)
    agg = {"agg": algo.loss_agg, "denominator": 1.0}
    tokens = float(mask.sum())
    metrics: dict[str, float] = {}
    pg = POLICY_LOSSES.get(algo.policy_loss)(log_probs, old, advantages, mask, **_policy_params(algo), **agg)
    loss = pg.loss
    _collect(metrics, pg.metrics, tokens)
    if algo.kl_loss_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("kl_loss_coef > 0 needs reference log-probs on the batch")
        kl = kl_loss(log_probs, batch.ref_logprobs.to(log_probs.device), mask, kind=algo.kl_loss_kind, **agg)
        loss = loss + algo.kl_loss_coef * kl.loss
        _collect(metrics, kl.metrics, tokens)
    if algo.entropy_coef > 0 and entropy is not None:
        ent = entropy_bonus(entropy, mask, coef=algo.entropy_coef, **agg)
        loss = loss + ent.loss
        # entropy_bonus reports the sum-form mean entropy; turn it into a token-weighted mean.
        metrics["actor/entropy"] = metrics.get("actor/entropy", 0.0) + float(
            (entropy.detach() * mask).sum())
    return Objective(loss, denominator(mask, algo.loss_agg), tokens, metrics)


def critic_objective(values: Tensor, batch: RolloutBatch, algo: AlgorithmConfig, clip_range: float | None) -> Objective:
    """Value loss (sum form) of predicted values (B, Lr) against the batch's returns."""
    mask = batch.response_mask.to(values.device)
    old = batch.values.to(values.device) if batch.values is not None else values.detach()
    out = value_loss(values, old, batch.returns.to(values.device), mask, clip_range=clip_range,
                     agg=algo.loss_agg, denominator=1.0)
    tokens = float(mask.sum())
    metrics: dict[str, float] = {}
    _collect(metrics, out.metrics, tokens)
    return Objective(out.loss, denominator(mask, algo.loss_agg), tokens, metrics)


class StepTotals:
    """Sums over a step's micro-batches of counts and metrics, reduced over ranks at the end."""

    def __init__(self) -> None:
        self.count = 0.0
        self.tokens = 0.0
        self.micro_batches = 0
        self.metrics: dict[str, float] = {}

    def add(self, obj: Objective, counted: bool = True) -> None:
        """Add a micro-batch; ``counted=False`` adds only its metrics (a critic alongside the policy)."""
        if counted:
            self.count += obj.count
            self.tokens += obj.tokens
            self.micro_batches += 1
        for k, v in obj.metrics.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v

    def as_vector(self) -> list[float]:
        """[count, tokens, then (value, present) per known metric]: the same layout on every rank."""
        out = [self.count, self.tokens]
        for name in METRIC_NAMES:
            out += [self.metrics.get(name, 0.0), 1.0 if name in self.metrics else 0.0]
        return out

    @staticmethod
    def summarize(vector: list[float]) -> tuple[float, dict[str, float]]:
        """(global count, metric means) from a summed ``as_vector``."""
        count, tokens = vector[0], vector[1]
        metrics: dict[str, float] = {}
        for i, name in enumerate(METRIC_NAMES):
            value, present = vector[2 + 2 * i], vector[3 + 2 * i]
            if present:
                metrics[name] = value / max(tokens if name in TOKEN_MEANS else count, 1.0)
        return count, metrics
