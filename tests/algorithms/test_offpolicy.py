"""The decoupled PPO objective: its reference form, and the embodied update's fused form of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from m2flow.algorithms.losses import ppo_policy_loss
from m2flow.algorithms.offpolicy import decoupled_ppo_loss, decoupled_ppo_weights, fresh_mask, sample_ages


def test_fresh_samples_make_the_decoupled_objective_plain_ppo():
    g = torch.Generator().manual_seed(0)
    lp, old, adv = torch.randn(32, generator=g), torch.randn(32, generator=g), torch.randn(32, generator=g)
    assert torch.equal(decoupled_ppo_weights(old, old), torch.ones(32))
    plain = ppo_policy_loss(lp[None], old[None], adv[None], torch.ones(1, 32, dtype=torch.bool)).loss
    torch.testing.assert_close(decoupled_ppo_loss(lp, old, old, adv), plain)


def test_the_importance_weight_scales_each_sample_and_has_no_gradient():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(16, generator=g, requires_grad=True)
    prox, behav, adv = torch.randn(16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g)
    w = decoupled_ppo_weights(prox, behav)
    torch.testing.assert_close(w, torch.exp(prox - behav))
    assert decoupled_ppo_weights(prox, behav, cap=1.5).max() <= 1.5
    ratio = torch.exp(lp.detach() - prox)
    loop = -sum(float(w[i]) * min(float(ratio[i] * adv[i]), float(ratio[i].clamp(0.8, 1.2) * adv[i]))
                for i in range(16)) / 16
    loss = decoupled_ppo_loss(lp, prox, behav, adv)
    assert abs(float(loss) - loop) < 1e-5
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()


def test_ages_and_the_bound():
    ages = sample_ages(5, torch.tensor([5, 4, 3, 6]))
    assert ages.tolist() == [0, 1, 2, -1]
    assert fresh_mask(ages, 1).tolist() == [True, True, False, False]


def test_the_embodied_update_computes_the_decoupled_objective():
    from m2flow.models.policies import PolicyConfig, build_policy
    from m2flow.workers.embodied.config import PPOConfig
    from m2flow.workers.embodied.ppo import PPOUpdater, evaluate_actions

    torch.manual_seed(0)
    policy = build_policy(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32),
                          PolicyConfig(hidden_sizes=[8]))
    updater = PPOUpdater(policy, PPOConfig())
    g = torch.Generator().manual_seed(2)
    obs, act = torch.randn(24, 3, generator=g), torch.randn(24, 2, generator=g)
    with torch.no_grad():
        prox, values = evaluate_actions(policy, obs, act)
        for p in policy.parameters():  # the new policy: a step away from the proximal one
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    behav = prox + 0.3 * torch.randn(24, generator=g)
    adv, ret = torch.randn(24, generator=g), torch.randn(24, generator=g)
    w = decoupled_ppo_weights(prox, behav)
    _, metrics = updater.minibatch_loss(obs, act, prox, adv, ret, values, weights=w)
    with torch.no_grad():
        lp, _ = evaluate_actions(policy, obs, act)
    torch.testing.assert_close(metrics["actor/pg_loss"], decoupled_ppo_loss(lp, prox, behav, adv))


def test_one_staleness_filter_splits_items_by_age_and_refuses_the_future():
    from m2flow.algorithms.offpolicy import split_by_staleness

    split = split_by_staleness(5, [5, 4, 3, 2], [10, 20, 30, 40], max_staleness=2)
    assert split.ages == [0, 1, 2, 3] and split.fresh == [True, True, True, False]
    assert split.by_age == [10.0, 20.0, 30.0] and split.dropped == 40.0
    assert split_by_staleness(0, [], [], 1).by_age == [0.0, 0.0]
    with pytest.raises(ValueError, match="item 1 was produced by weights of version 7"):
        split_by_staleness(5, [5, 7], [1, 1], max_staleness=2)
