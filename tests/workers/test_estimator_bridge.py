"""The actor's bridge to the estimator registry: fields in, advantages out, hyper-parameters filtered."""

from __future__ import annotations

import pytest
import torch

from m2flow.data.batch import RolloutBatch
from m2flow.workers.estimator_bridge import estimator_params, fill_advantages, reward_kl
from m2flow.workers.config import AlgorithmConfig


def _batch(rewards: list[float], groups: list[int]) -> RolloutBatch:
    b = len(rewards)
    mask = torch.tensor([[1, 1, 0]] * b)
    return RolloutBatch(
        prompt_ids=torch.ones(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1, dtype=torch.long),
        response_ids=torch.ones_like(mask), response_mask=mask, group_ids=torch.tensor(groups),
        truncated=torch.zeros(b, dtype=torch.bool), rewards=torch.tensor(rewards))


def test_grpo_advantages_by_hand():
    batch = _batch([1.0, 0.0, 0.0, 0.0, 2.0, 2.0], [7, 7, 7, 7, 9, 9])
    fill_advantages(batch, AlgorithmConfig(adv_estimator="grpo"))
    # Group 7: mean 0.25, Bessel std 0.5 -> (1.5, -0.5, -0.5, -0.5); group 9 is constant -> 0.
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0]).unsqueeze(1) * torch.tensor([[1.0, 1.0, 0.0]])
    assert torch.allclose(batch.advantages, expected, atol=1e-5)


def test_only_the_parameters_an_estimator_takes_are_passed():
    algo = AlgorithmConfig(gamma=0.9, lam=0.8, kl_reward_coef=0.1, adv_estimator="gae")
    assert estimator_params(algo) == {"gamma": 0.9, "lam": 0.8, "kl_coef": 0.1}
    assert estimator_params(algo, "rloo") == {}
    assert estimator_params(algo, "grpo") == {"norm_by_std": True}


def test_reward_kl_uses_behaviour_and_reference_logprobs_on_response_tokens():
    batch = _batch([1.0, 0.0], [0, 0])
    batch.old_logprobs = torch.tensor([[-1.0, -2.0, 5.0], [-1.0, -1.0, 5.0]])
    batch.ref_logprobs = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, 0.0]])
    algo = AlgorithmConfig(adv_estimator="reinforce_pp", kl_reward_coef=0.1)
    kl = reward_kl(batch, algo)
    assert torch.equal(kl, torch.tensor([[0.5, -1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert reward_kl(batch, AlgorithmConfig()) is None


def test_missing_rewards_fail_clearly():
    batch = _batch([1.0], [0])
    batch.rewards = None
    with pytest.raises(ValueError, match="no rewards"):
        fill_advantages(batch, AlgorithmConfig())
