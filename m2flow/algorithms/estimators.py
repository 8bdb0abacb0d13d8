"""Registered advantage estimators with one call shape: ``ADV_ESTIMATORS.get(name)(inputs, **params)``.

``inputs`` is a ``TokenBatch`` (reasoning, (B, L)) or a ``StepBatch`` (embodied, (T, N)); each
estimator reads the fields it documents and says clearly which it is missing. All return an
``AdvantageOutput``. ``params`` are the estimator's own hyper-parameters (gamma, lam, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from m2flow.algorithms import advantages as adv
from m2flow.algorithms.masked import masked_whiten, scores_to_token_rewards
from m2flow.algorithms.registry import ADV_ESTIMATORS


@dataclass
class TokenBatch:
    """Reasoning batch of B responses padded to length L (batch-major)."""

    response_mask: Tensor  # (B, L) 1 on response tokens
    scores: Tensor | None = None  # (B,) outcome reward per response
    group_index: Tensor | None = None  # (B,) prompt id: responses to one prompt form a group
    token_rewards: Tensor | None = None  # (B, L) per-token reward; overrides scores when set
    values: Tensor | None = None  # (B, L) critic values V(prefix up to token t)
    kl: Tensor | None = None  # (B, L) per-token KL(policy || reference), for KL-in-reward


@dataclass
class StepBatch:
    """Embodied rollout of T steps from N parallel environments (time-major)."""

    rewards: Tensor  # (T, N)
    dones: Tensor  # (T, N) episode ended at step t (terminated or truncated)
    values: Tensor | None = None  # (T, N) V(s_t)
    next_values: Tensor | None = None  # (N,) V(s_T) for bootstrapping
    terminated: Tensor | None = None  # (T, N) ended by the task, not by a time limit
    final_values: Tensor | None = None  # (T, N) V(last observation) where truncated
    group_index: Tensor | None = None  # (N,) envs started from the same state share an id


@dataclass
class AdvantageOutput:
    """Advantages and returns in the layout of the inputs, and where they are defined."""

    advantages: Tensor  # (B, L) or (T, N)
    returns: Tensor  # (B, L) or (T, N); value targets for critic-based estimators
    mask: Tensor  # (B, L) or (T, N) bool: entries that count in the loss


def compute_advantages(name: str, inputs: TokenBatch | StepBatch, **params: Any) -> AdvantageOutput:
    """Run the estimator registered as ``name`` (see ``ADV_ESTIMATORS.names()``)."""
    return ADV_ESTIMATORS.get(name)(inputs, **params)


def _need(inputs: object, estimator: str, *names: str) -> None:
    missing = [n for n in names if getattr(inputs, n) is None]
    if missing:
        fields = ", ".join(missing)
        raise ValueError(f"advantage estimator {estimator!r} needs {type(inputs).__name__}.{fields}")


def _token_only(inputs: object, estimator: str) -> TokenBatch:
    if not isinstance(inputs, TokenBatch):
        raise TypeError(f"advantage estimator {estimator!r} takes a TokenBatch, got {type(inputs).__name__}")
    return inputs


def _token_rewards(inputs: TokenBatch, estimator: str, kl_coef: float) -> Tensor:
    """(B, L) token rewards: given ones or the score on the last token, minus kl_coef * kl."""
    if inputs.token_rewards is None:
        _need(inputs, estimator, "scores")
        assert inputs.scores is not None
        rewards = scores_to_token_rewards(inputs.scores, inputs.response_mask)
    else:
        rewards = inputs.token_rewards
    if kl_coef:
        _need(inputs, estimator, "kl")
        assert inputs.kl is not None
        rewards = rewards - kl_coef * inputs.kl
    return rewards


def _broadcast(per_seq: Tensor, response_mask: Tensor) -> AdvantageOutput:
    """One value per sequence (B,) copied to its response tokens (B, L)."""
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=per_seq.dtype, device=per_seq.device)
    tokens = torch.where(mask, per_seq.unsqueeze(-1), zero)
    return AdvantageOutput(tokens, tokens, mask)


@ADV_ESTIMATORS.register("gae")
def gae_estimator(
    inputs: TokenBatch | StepBatch,
    *,
    gamma: float | None = None,
    lam: float | None = None,
    kl_coef: float = 0.0,
    whiten: bool | None = None,
) -> AdvantageOutput:
    """PPO's GAE (Schulman et al. 2015) for either layout.

    Token batches need values and scores/token_rewards; defaults gamma = lam = 1 and whitening
    over the batch's response tokens. Step batches need values and next_values; defaults
    gamma 0.99, lam 0.95 and no whitening (normalise per mini-batch in the loss instead).
    """
    if isinstance(inputs, StepBatch):
        _need(inputs, "gae", "values", "next_values")
        assert inputs.values is not None and inputs.next_values is not None
        advantages, returns = adv.compute_gae(
            inputs.rewards,
            inputs.values,
            inputs.dones,
            inputs.next_values,
            gamma=0.99 if gamma is None else gamma,
            lam=0.95 if lam is None else lam,
            terminated=inputs.terminated,
            final_values=inputs.final_values,
        )
        mask = torch.ones_like(advantages, dtype=torch.bool)
        if whiten:
            advantages = masked_whiten(advantages, mask)
        return AdvantageOutput(advantages, returns, mask)
    inputs = _token_only(inputs, "gae")
    _need(inputs, "gae", "values")
    assert inputs.values is not None
    rewards = _token_rewards(inputs, "gae", kl_coef)
    advantages, returns = adv.compute_token_gae(
        rewards,
        inputs.values,
        inputs.response_mask,
        gamma=1.0 if gamma is None else gamma,
        lam=1.0 if lam is None else lam,
    )
    if whiten is None or whiten:
        advantages = masked_whiten(advantages, inputs.response_mask)
    return AdvantageOutput(advantages, returns, inputs.response_mask.bool())


def _grpo(
    inputs: TokenBatch | StepBatch, name: str, norm_by_std: bool, group_size: int | None, eps: float
) -> AdvantageOutput:
    if isinstance(inputs, StepBatch):
        advantages, _, step_mask = adv.grpo_episode_advantage(
            inputs.rewards,
            inputs.dones,
            group_index=inputs.group_index,
            group_size=group_size,
            norm_by_std=norm_by_std,
            eps=eps,
        )
        return AdvantageOutput(advantages, advantages, step_mask)
    inputs = _token_only(inputs, name)
    _need(inputs, name, "scores")
    assert inputs.scores is not None
    per_seq = adv.grpo_outcome_advantage(
        inputs.scores, group_index=inputs.group_index, group_size=group_size, norm_by_std=norm_by_std, eps=eps
    )
    return _broadcast(per_seq, inputs.response_mask)


@ADV_ESTIMATORS.register("grpo")
def grpo_estimator(
    inputs: TokenBatch | StepBatch,
    *,
    group_size: int | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GRPO (Shao et al. 2024): outcome scores, or embodied episode returns, normalised per group."""
    return _grpo(inputs, "grpo", norm_by_std, group_size, eps)


@ADV_ESTIMATORS.register("dr_grpo")
def dr_grpo_estimator(
    inputs: TokenBatch | StepBatch, *, group_size: int | None = None, eps: float = 1e-6
) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025): GRPO without the std division (pair with a constant-length loss)."""
    return _grpo(inputs, "dr_grpo", False, group_size, eps)


@ADV_ESTIMATORS.register("rloo")
def rloo_estimator(inputs: TokenBatch | StepBatch, *, group_size: int | None = None) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024): each score minus the mean of the others in its group."""
    inputs = _token_only(inputs, "rloo")
    _need(inputs, "rloo", "scores")
    assert inputs.scores is not None
    per_seq = adv.rloo_advantage(inputs.scores, group_index=inputs.group_index, group_size=group_size)
    return _broadcast(per_seq, inputs.response_mask)


@ADV_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_estimator(
    inputs: TokenBatch | StepBatch, *, gamma: float = 1.0, kl_coef: float = 0.0, eps: float = 1e-8
) -> AdvantageOutput:
    """REINFORCE++ (Hu et al. 2025): discounted return with KL-in-reward, whitened over the batch."""
    inputs = _token_only(inputs, "reinforce_pp")
    rewards = _token_rewards(inputs, "reinforce_pp", kl_coef)
    advantages, returns = adv.reinforce_pp_advantage(rewards, inputs.response_mask, gamma=gamma, eps=eps)
    return AdvantageOutput(advantages, returns, inputs.response_mask.bool())


@ADV_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline_estimator(
    inputs: TokenBatch | StepBatch,
    *,
    group_size: int | None = None,
    gamma: float = 1.0,
    kl_coef: float = 0.0,
    eps: float = 1e-8,
) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu et al. 2025): scores minus group mean, then REINFORCE++ whitening."""
    inputs = _token_only(inputs, "reinforce_pp_baseline")
    _need(inputs, "reinforce_pp_baseline", "scores")
    assert inputs.scores is not None
    centred = adv.group_baseline(inputs.scores, group_index=inputs.group_index, group_size=group_size)
    shifted = TokenBatch(inputs.response_mask, scores=centred, kl=inputs.kl)
    rewards = _token_rewards(shifted, "reinforce_pp_baseline", kl_coef)
    advantages, returns = adv.reinforce_pp_advantage(rewards, inputs.response_mask, gamma=gamma, eps=eps)
    return AdvantageOutput(advantages, returns, inputs.response_mask.bool())
