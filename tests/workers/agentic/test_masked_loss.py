"""Observation tokens inside a multi-turn response carry no loss: the gradient there is exactly zero."""

from __future__ import annotations

import pytest
import torch

from m2flow.envs.text import TextEnvBatch
from m2flow.models.causal_lm import entropy_from_logits, logprobs_from_logits
from m2flow.models.response_forward import HFResponseForward, trim_span
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.workers.estimator_bridge import fill_advantages
from m2flow.workers.agentic import EpisodeConfig, run_episodes, to_rollout_batch
from m2flow.workers.config import AlgorithmConfig
from m2flow.workers.objective import critic_objective, policy_objective
from tests.workers.agentic.scripted import ScriptedBackend, char_tokenizer
from tests.workers.agentic.test_episode import _solver

TOK = char_tokenizer()


def _batch():
    envs = TextEnvBatch.from_registry("calculator", 4)
    trajs, _ = run_episodes(ScriptedBackend(TOK, _solver), TOK, envs, [1, 1, 2, 2], [0, 0, 1, 1], EpisodeConfig())
    batch = to_rollout_batch(trajs, TOK.pad_token_id)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # groups with a spread: non-zero GRPO advantages
    return batch


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp"])
def test_the_policy_gradient_is_zero_at_observation_tokens(estimator):
    torch.manual_seed(0)
    batch = _batch()
    algo = AlgorithmConfig(adv_estimator=estimator, old_logprobs="rollout", entropy_coef=0.01)
    fill_advantages(batch, algo)
    observation = (batch.response_mask == 1) & (batch.action_mask == 0)
    assert observation.any() and (batch.advantages[observation] == 0).all()
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOK)
    span = trim_span(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    logits = HFResponseForward().logits(model, batch.prompt_ids, batch.prompt_mask, span).detach().requires_grad_()
    log_probs = logprobs_from_logits(logits, span.response_ids)
    entropy = entropy_from_logits(logits)
    policy_objective(log_probs, entropy, batch, algo).loss.backward()
    grad = logits.grad.abs().sum(-1)  # (B, Lr)
    assert (grad[observation[:, : span.lr]] == 0).all()
    assert (grad[batch.action_mask[:, : span.lr].bool()] > 0).any()


def test_the_critic_loss_is_zero_at_observation_tokens():
    batch = _batch()
    algo = AlgorithmConfig(adv_estimator="gae")
    values = torch.randn(batch.response_ids.shape, requires_grad=True)
    batch.values = values.detach()
    fill_advantages(batch, algo)
    critic_objective(values, batch, algo, clip_range=None).loss.backward()
    observation = (batch.response_mask == 1) & (batch.action_mask == 0)
    assert (values.grad[observation] == 0).all() and (values.grad[batch.action_mask.bool()] != 0).any()
