"""Bounded-staleness (asynchronous) PPO: sample ages and the decoupled PPO objective.

With asynchronous collection a sample is produced by the *behaviour* policy pi_behav (the weights
the env ranks acted with, some iterations old) and trained on by a learner whose weights at the
start of the update are the *proximal* policy pi_prox. The decoupled PPO objective of Hilton et al.
2021 ("Batch size-invariance for policy optimization", arXiv 2110.00641), as used by AReaL (Fu et
al. 2025, arXiv 2505.24298), clips the ratio against the proximal policy and corrects for the
behaviour policy with a constant importance weight:

    L(theta) = E_{a ~ pi_behav} [ w * min(r * A, clip(r, 1 - eps, 1 + eps) * A) ],
    r = pi_theta / pi_prox,   w = pi_prox / pi_behav   (no gradient through w)

Since ``w > 0``, ``w * min(r A, clip(r) A) = min(r (w A), clip(r) (w A))``: the objective is the
standard clipped surrogate against pi_prox with the advantage scaled by ``w`` per sample, which is
how the embodied PPO update applies it. A fresh sample (pi_behav = pi_prox) has ``w = 1`` exactly,
so with staleness 0 the objective is standard PPO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def sample_ages(current_version: int, versions: Tensor) -> Tensor:
    """(B,) int versions of the weights that produced each sample -> (B,) ages in learner updates."""
    return current_version - versions


def fresh_mask(ages: Tensor, max_staleness: int) -> Tensor:
    """(B,) ages -> (B,) bool: the samples that may be trained on (0 <= age <= ``max_staleness``)."""
    return (ages >= 0) & (ages <= max_staleness)


@dataclass(frozen=True)
class StalenessSplit:
    """Which items of an iteration may be trained on under a staleness bound, and their counts by age."""

    fresh: list[bool]
    """per item: within the bound (trained on) or older (dropped)"""
    ages: list[int]
    """per item: learner updates since the weights that produced it"""
    by_age: list[float]
    """the sizes of the fresh items by age 0..s"""
    dropped: float
    """the size of the items older than s"""


def split_by_staleness(current_version: int, versions: Sequence[int], sizes: Sequence[float],
                       max_staleness: int) -> StalenessSplit:
    """The one staleness filter of both workflows: items (groups, trajectories) produced by weights of
    ``versions``, of ``sizes`` samples each, against a learner at ``current_version``. An item from a
    version newer than the learner's is a bug of the schedule and raises ValueError naming it."""
    ages = sample_ages(current_version, torch.tensor(list(versions), dtype=torch.long)).tolist() if versions else []
    for i, age in enumerate(ages):
        if age < 0:
            raise ValueError(f"item {i} was produced by weights of version {versions[i]}, newer than the "
                             f"learner's {current_version}")
    fresh = fresh_mask(torch.tensor(ages, dtype=torch.long), max_staleness).tolist() if ages else []
    by_age = [0.0] * (max_staleness + 1)
    dropped = 0.0
    for age, ok, size in zip(ages, fresh, sizes):
        if ok:
            by_age[age] += float(size)
        else:
            dropped += float(size)
    return StalenessSplit(fresh, ages, by_age, dropped)


def decoupled_ppo_weights(proximal_logprobs: Tensor, behaviour_logprobs: Tensor,
                          cap: float | None = None) -> Tensor:
    """(B,), (B,) -> (B,) importance weights ``w = pi_prox / pi_behav`` (Hilton et al. 2021), detached.

    ``cap`` truncates the weights from above (AReaL's behaviour importance-weight cap); None: no cap.
    """
    w = torch.exp((proximal_logprobs - behaviour_logprobs).detach())
    return w if cap is None else w.clamp(max=cap)


def decoupled_ppo_loss(logprobs: Tensor, proximal_logprobs: Tensor, behaviour_logprobs: Tensor,
                       advantages: Tensor, clip: float = 0.2) -> Tensor:
    """The decoupled clipped surrogate of the module docstring, averaged; all tensors (B,).

    The plain reference of what the embodied update computes in its fused form (tests compare them).
    """
    w = decoupled_ppo_weights(proximal_logprobs, behaviour_logprobs)
    ratio = torch.exp(logprobs - proximal_logprobs.detach())
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages)
    return -(w * surrogate).mean()


def staleness_metrics(by_age: list[float], dropped: float) -> dict[str, float]:
    """``async/*`` of one iteration: the samples trained on by age (``by_age[a]``, a = 0..s, in actor
    iterations), their mean and maximum age, and the samples dropped for being older than s."""
    trained = sum(by_age)
    out = {f"async/age_{a}_samples": float(c) for a, c in enumerate(by_age)}
    out["async/dropped_samples"] = float(dropped)
    out["async/staleness_mean"] = sum(a * c for a, c in enumerate(by_age)) / trained if trained else float("nan")
    out["async/staleness_max"] = float(max((a for a, c in enumerate(by_age) if c), default=0))
    return out
