"""From a rollout batch to the estimator's inputs and back: the actor's call into the algorithms registry.

Nothing here computes an advantage: it gathers the fields an estimator reads (scores, groups, values,
KL) into a ``TokenBatch``, passes the hyper-parameters the estimator accepts, and stores the result.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from m2flow.algorithms import ADV_ESTIMATORS, TokenBatch, kl_estimate
from m2flow.data.batch import RolloutBatch
from m2flow.workers.config import AlgorithmConfig


def estimator_params(algo: AlgorithmConfig, name: str | None = None) -> dict[str, Any]:
    """The configured hyper-parameters that estimator ``name`` (default: the configured one) takes."""
    name = name or algo.adv_estimator
    offered = {
        "norm_by_std": algo.norm_adv_by_std,
        "gamma": algo.gamma,
        "lam": algo.lam,
        "kl_coef": algo.kl_reward_coef,
    }
    accepted = inspect.signature(ADV_ESTIMATORS.get(name)).parameters
    return {k: v for k, v in offered.items() if k in accepted}


def reward_kl(batch: RolloutBatch, algo: AlgorithmConfig) -> torch.Tensor | None:
    """(B, Lr) per-token KL(behaviour || reference) for KL-in-reward, or None when it is off."""
    if algo.kl_reward_coef <= 0:
        return None
    behaviour = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
    if behaviour is None or batch.ref_logprobs is None:
        raise ValueError("KL in the reward needs behaviour and reference log-probs on the batch")
    mask = batch.loss_mask.bool()
    kl = kl_estimate(behaviour, batch.ref_logprobs, algo.kl_reward_kind)
    return torch.where(mask, kl, torch.zeros_like(kl))


def fill_advantages(batch: RolloutBatch, algo: AlgorithmConfig) -> None:
    """Set ``batch.advantages`` and ``batch.returns`` (B, Lr) with the configured estimator."""
    if batch.rewards is None:
        raise ValueError("the batch has no rewards; the reward stage must run first")
    inputs = TokenBatch(
        response_mask=batch.loss_mask,
        scores=batch.rewards.float(),
        group_index=batch.group_ids,
        values=batch.values,
        kl=reward_kl(batch, algo),
    )
    out = ADV_ESTIMATORS.get(algo.adv_estimator)(inputs, **estimator_params(algo))
    mask = batch.loss_mask.bool()
    zero = torch.zeros((), dtype=out.advantages.dtype)
    batch.advantages = torch.where(mask, out.advantages, zero)
    batch.returns = torch.where(mask, out.returns, zero)
