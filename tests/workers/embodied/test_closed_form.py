"""The closed-form PPO gradient against autograd of the one definition of the loss (`ppo_minibatch_loss`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.algorithms.minibatch_ppo import ppo_minibatch_loss
from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.workers.embodied.closed_form import ClosedFormPPO
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.minibatch_forward import MinibatchForward

torch.set_num_threads(1)

OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
N = 40  # samples of the whole minibatch; the share below is 30 of them, as one of several ranks


def _data(discrete: bool, rows: int = 30) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    obs = torch.randn(rows, 5, generator=g)
    actions = torch.randint(0, 4, (rows,), generator=g) if discrete else torch.randn(rows, 3, generator=g)
    old_logprobs = torch.randn(rows, generator=g) * 0.1 - (1.4 if discrete else 3.0)
    advantages = torch.randn(rows, generator=g)
    returns = torch.randn(rows, generator=g)
    return obs, actions, old_logprobs, advantages, returns


def _autograd(policy, cfg: PPOConfig, obs, actions, offset, neg_adv, returns) -> tuple[torch.Tensor, torch.Tensor]:
    """d loss / d parameters (flattened) and the parts, through autograd of `ppo_minibatch_loss`."""
    forward = MinibatchForward(policy)
    log_ratio, values, log_p = forward.evaluate(obs, actions, offset)
    entropy = forward.entropy_sum(log_p, obs.shape[0]) if cfg.ent_coef else None
    loss, parts = ppo_minibatch_loss(log_ratio, neg_adv, values if cfg.use_critic else None, returns,
                                     clip=cfg.clip, scale=1 / N, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                                     entropy_sum=entropy)
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.reshape(-1) for g in grads]), parts


@pytest.mark.parametrize("discrete", [False, True], ids=["gaussian", "categorical"])
@pytest.mark.parametrize("ent_coef", [0.0, 0.5], ids=["no entropy bonus", "entropy bonus"])
@pytest.mark.parametrize("shared", [False, True], ids=["separate critic", "shared trunk"])
def test_closed_form_gradient_is_autograd_of_the_loss(discrete, ent_coef, shared):
    cfg = PPOConfig(clip=0.1, vf_coef=0.7, ent_coef=ent_coef)  # the value loss counts (use_critic)
    torch.manual_seed(0)
    policy = build_policy(OBS, gym.spaces.Discrete(4) if discrete else BOX,
                          PolicyConfig(hidden_sizes=[16, 8], shared_critic=shared))
    obs, actions, old_logprobs, advantages, returns = _data(discrete)
    forward = MinibatchForward(policy)
    actions, offset = forward.prepare_actions(actions), forward.offset(old_logprobs)
    neg_adv = -advantages / N
    expected, parts = _autograd(policy, cfg, obs, actions, offset, neg_adv, returns)
    assert expected.abs().max() > 1e-3  # a gradient worth comparing
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.full_like(p, 123.0)  # the closed form must overwrite every gradient
    closed_parts = ClosedFormPPO(policy, cfg, params).step(obs, actions, offset, neg_adv, returns, 1 / N)
    got = torch.cat([p.grad.reshape(-1) for p in params])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(closed_parts, parts, rtol=0, atol=1e-5)


def test_the_entropy_bonus_changes_the_categorical_gradient():
    """The entropy term is not lost on the way: with it, the gradient moves by autograd's difference."""
    torch.manual_seed(0)
    policy = build_policy(OBS, gym.spaces.Discrete(4), PolicyConfig(hidden_sizes=[16]))
    obs, actions, old_logprobs, advantages, returns = _data(True)
    forward = MinibatchForward(policy)
    actions, offset = forward.prepare_actions(actions), forward.offset(old_logprobs)
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    grads = []
    for ent_coef in (0.0, 5.0):
        ClosedFormPPO(policy, PPOConfig(ent_coef=ent_coef), params).step(obs, actions, offset, -advantages / N,
                                                                         returns, 1 / N)
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
    with_bonus, _ = _autograd(policy, PPOConfig(ent_coef=5.0), obs, actions, offset, -advantages / N, returns)
    without, _ = _autograd(policy, PPOConfig(), obs, actions, offset, -advantages / N, returns)
    assert (with_bonus - without).abs().max() > 1e-3
    torch.testing.assert_close(grads[1] - grads[0], with_bonus - without, rtol=0, atol=1e-6)
