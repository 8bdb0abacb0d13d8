"""Advantage estimators: hand-worked cases, loop references on random inputs, properties."""

from __future__ import annotations

import math

import pytest
import torch

from m2flow.algorithms.advantages import (
    compute_gae,
    compute_token_gae,
    discounted_returns,
    group_baseline,
    grpo_episode_advantage,
    grpo_outcome_advantage,
    reinforce_pp_advantage,
    rloo_advantage,
)
from m2flow.algorithms.masked import scores_to_token_rewards
from tests.algorithms import loop_reference as ref

torch.set_num_threads(1)
F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(actual: torch.Tensor, expected, tol: float = 1e-9) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=tol)


# ---------------------------------------------------------------- hand-worked cases


def test_gae_by_hand_no_done():
    # gamma = lam = 0.5, V = [1, 2, 4], V(s_T) = 8, r = [1, 0, 2]
    # delta2 = 2 + 0.5*8 - 4 = 2      A2 = 2
    # delta1 = 0 + 0.5*4 - 2 = 0      A1 = 0 + 0.25*2   = 0.5
    # delta0 = 1 + 0.5*2 - 1 = 1      A0 = 1 + 0.25*0.5 = 1.125
    adv, ret = compute_gae(
        t([[1.0], [0.0], [2.0]]), t([[1.0], [2.0], [4.0]]), t([[0], [0], [0]]), t([8.0]), gamma=0.5, lam=0.5
    )
    close(adv, [[1.125], [0.5], [2.0]])
    close(ret, [[2.125], [2.5], [6.0]])  # A + V


def test_gae_by_hand_termination_and_truncation():
    rewards, values = t([[1.0], [0.0], [2.0]]), t([[1.0], [2.0], [4.0]])
    dones = t([[0], [1], [0]])
    # Terminated at t=1: no bootstrap and no flow back from t=2.
    # delta2 = 2 + 4 - 4 = 2   A2 = 2
    # delta1 = 0 + 0 - 2 = -2  A1 = -2
    # delta0 = 1 + 1 - 1 = 1   A0 = 1 + 0.25*(-2) = 0.5
    adv, _ = compute_gae(rewards, values, dones, t([8.0]), gamma=0.5, lam=0.5)
    close(adv, [[0.5], [-2.0], [2.0]])
    # Truncated at t=1 with V(final obs) = 6: delta1 = 0 + 0.5*6 - 2 = 1, A1 = 1, A0 = 1 + 0.25 = 1.25
    adv, _ = compute_gae(
        rewards, values, dones, t([8.0]), gamma=0.5, lam=0.5,
        terminated=t([[0], [0], [0]]), final_values=t([[0.0], [6.0], [0.0]]),
    )
    close(adv, [[1.25], [1.0], [2.0]])


def test_gae_over_decisions_by_hand():
    # Action chunks of 2 env steps, gamma = 0.5 per env step: decisions are gamma^2 = 0.25 apart, except
    # decision 1, whose episode was truncated after 1 of its 2 steps (discount 0.5 to its final obs, V = 6).
    # r (the chunks' discounted sums) = [1, 0, 2], V = [1, 2, 4], V(s_T) = 8, lam = 0.5
    # delta2 = 2 + 0.25*8 - 4 = 0      A2 = 0
    # delta1 = 0 + 0.5*6 - 2 = 1       A1 = 1 (the episode ended: nothing flows back from t=2)
    # delta0 = 1 + 0.25*2 - 1 = 0.5    A0 = 0.5 + 0.25*0.5*1 = 0.625
    adv, ret = compute_gae(
        t([[1.0], [0.0], [2.0]]), t([[1.0], [2.0], [4.0]]), t([[0], [1], [0]]), t([8.0]), gamma=0.5, lam=0.5,
        terminated=t([[0], [0], [0]]), final_values=t([[0.0], [6.0], [0.0]]), discounts=t([[0.25], [0.5], [0.25]]))
    close(adv, [[0.625], [1.0], [0.0]])
    close(ret, [[1.625], [3.0], [4.0]])
    # With no episode end every decision is 0.25 away: delta1 = 0 + 1 - 2 = -1, A1 = -1 + 0.125*0 = -1,
    # A0 = 0.5 + 0.125*(-1) = 0.375; and discounts all equal to gamma give plain GAE.
    adv, _ = compute_gae(t([[1.0], [0.0], [2.0]]), t([[1.0], [2.0], [4.0]]), t([[0], [0], [0]]), t([8.0]),
                         gamma=0.5, lam=0.5, discounts=t([[0.25], [0.25], [0.25]]))
    close(adv, [[0.375], [-1.0], [0.0]])
    plain, _ = compute_gae(t([[1.0], [0.0], [2.0]]), t([[1.0], [2.0], [4.0]]), t([[0], [0], [0]]), t([8.0]),
                           gamma=0.5, lam=0.5)
    same, _ = compute_gae(t([[1.0], [0.0], [2.0]]), t([[1.0], [2.0], [4.0]]), t([[0], [0], [0]]), t([8.0]),
                          gamma=0.9, lam=0.5, discounts=t([[0.5], [0.5], [0.5]]))
    close(same, plain)


def test_gae_needs_terminated_and_final_values_together():
    x = torch.zeros(2, 1)
    with pytest.raises(ValueError, match="together"):
        compute_gae(x, x, x, torch.zeros(1), terminated=x)


def test_token_gae_by_hand_with_padding_and_holes():
    # gamma = 1, lam = 0.5, response of 3 tokens, reward 1 on the last; V = [0.5, 0.25, 0.75]
    # delta2 = 1 + 0 - 0.75 = 0.25       A2 = 0.25
    # delta1 = 0 + 0.75 - 0.25 = 0.5     A1 = 0.5 + 0.5*0.25 = 0.625
    # delta0 = 0 + 0.25 - 0.5 = -0.25    A0 = -0.25 + 0.5*0.625 = 0.0625
    padded_mask = t([[1, 1, 1, 0]])
    adv, ret = compute_token_gae(
        t([[0.0, 0.0, 1.0, 99.0]]), t([[0.5, 0.25, 0.75, 7.0]]), padded_mask, gamma=1.0, lam=0.5
    )
    close(adv, [[0.0625, 0.625, 0.25, 0.0]])
    close(ret, [[0.5625, 0.875, 1.0, 0.0]])
    # The same three tokens with a masked hole at position 1 (e.g. tool output): skipped over.
    adv, _ = compute_token_gae(
        t([[0.0, 9.0, 0.0, 1.0]]), t([[0.5, 9.0, 0.25, 0.75]]), t([[1, 0, 1, 1]]), gamma=1.0, lam=0.5
    )
    close(adv, [[0.0625, 0.0, 0.625, 0.25]])
    # lam = gamma = 1: A_t = (sum of future rewards) - V_t = [0.5, 0.75, 0.25]
    adv, _ = compute_token_gae(t([[0.0, 0.0, 1.0, 0.0]]), t([[0.5, 0.25, 0.75, 0.0]]), padded_mask)
    close(adv, [[0.5, 0.75, 0.25, 0.0]])


def test_grpo_rloo_drgrpo_by_hand():
    scores = t([1.0, 0.0, 0.0, 2.0, 2.0])
    groups = torch.tensor([7, 7, 7, 3, 3])
    # group 7: mean 1/3; unbiased var = ((2/3)^2 + 2*(1/3)^2) / 2 = 1/3, std = 1/sqrt(3)
    # A = (2/3) * sqrt(3) = 1.1547..., (-1/3) * sqrt(3) = -0.5773...; group 3 is constant: 0
    s3 = math.sqrt(3)
    close(grpo_outcome_advantage(scores, group_index=groups, eps=0.0), [2 / 3 * s3, -s3 / 3, -s3 / 3, 0, 0])
    # Dr. GRPO: no std division
    close(grpo_outcome_advantage(scores, group_index=groups, norm_by_std=False), [2 / 3, -1 / 3, -1 / 3, 0, 0])
    # RLOO: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5; group 3: 2 - 2 = 0
    close(rloo_advantage(scores, group_index=groups), [1.0, -0.5, -0.5, 0.0, 0.0])


def test_group_size_and_singletons():
    scores = t([3.0, 1.0, 5.0, 5.0])
    # contiguous groups of 2: (3, 1) -> mean 2, std sqrt(2); (5, 5) -> 0
    close(grpo_outcome_advantage(scores, group_size=2, eps=0.0), [1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0])
    # a group of one has no baseline: advantage 0 for every estimator
    lone = torch.tensor([0, 1, 1, 1])
    assert grpo_outcome_advantage(scores, group_index=lone)[0] == 0
    assert rloo_advantage(scores, group_index=lone)[0] == 0
    assert group_baseline(scores, group_index=lone)[0] == 0
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_outcome_advantage(scores, group_size=3)
    with pytest.raises(ValueError, match="group_index"):
        grpo_outcome_advantage(scores)


def test_reinforce_pp_by_hand():
    # Two responses: scores 1 and 0, masks [1, 1] and [1, 0]; kl_coef * kl = [[0.5, 0], [0.25, -]]
    # token rewards: [-0.5, 1.0] and [-0.25]; reward-to-go (gamma 1): [0.5, 1.0] and [-0.25]
    # whitened over {0.5, 1.0, -0.25}: mean 5/12, unbiased var = 0.791666.../2, std = 0.62915...
    mask = t([[1, 1], [1, 0]])
    token_rewards = scores_to_token_rewards(t([1.0, 0.0]), mask) - t([[0.5, 0.0], [0.25, 0.0]])
    adv, ret = reinforce_pp_advantage(token_rewards, mask, eps=0.0)
    close(ret, [[0.5, 1.0], [-0.25, 0.0]])
    mean = 5 / 12
    std = math.sqrt(((0.5 - mean) ** 2 + (1.0 - mean) ** 2 + (-0.25 - mean) ** 2) / 2)
    assert std == pytest.approx(0.629153, abs=1e-6)
    close(adv, [[(0.5 - mean) / std, (1.0 - mean) / std], [(-0.25 - mean) / std, 0.0]])
    # gamma = 0.5 discounts the last-token reward: row 0 returns [-0.5 + 0.5*1, 1] = [0, 1]
    close(discounted_returns(token_rewards, mask, gamma=0.5), [[0.0, 1.0], [-0.25, 0.0]])


def test_grpo_episodes_by_hand():
    # env 0 ends at t=1: return 1 + 1 = 2, its step 2 is after the episode; env 1 never ends: 0+1+0 = 1
    # group (2, 1): mean 1.5, std sqrt(0.5) -> A = +-0.5/sqrt(0.5) = +-0.7071
    rewards = t([[1.0, 0.0], [1.0, 1.0], [5.0, 0.0]])
    dones = t([[0, 0], [1, 0], [0, 0]])
    adv, returns, mask = grpo_episode_advantage(rewards, dones, group_size=2, eps=0.0)
    a = 0.5 / math.sqrt(0.5)
    close(returns, [2.0, 1.0])
    close(adv, [[a, -a], [a, -a], [0.0, -a]])
    assert mask.tolist() == [[True, True], [True, True], [False, True]]


# ---------------------------------------------------------------- against the loop references


def random_mask(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """Right-padded responses of random lengths (some empty) with occasional holes."""
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)
    holes = torch.rand(batch, length, generator=gen) < 0.1
    mask[holes] = 0
    mask[0, 0] = 1  # at least one token in the batch
    return mask


SEEDS = range(20)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_loop(seed: int):
    gen = torch.Generator().manual_seed(seed)
    steps, envs = int(torch.randint(1, 12, (1,), generator=gen)), int(torch.randint(1, 6, (1,), generator=gen))
    rewards = torch.randn(steps, envs, generator=gen, dtype=F64)
    values = torch.randn(steps, envs, generator=gen, dtype=F64)
    dones = (torch.rand(steps, envs, generator=gen) < 0.25).to(F64)
    terminated = dones * (torch.rand(steps, envs, generator=gen) < 0.5)
    final_values = torch.randn(steps, envs, generator=gen, dtype=F64)
    next_values = torch.randn(envs, generator=gen, dtype=F64)
    gamma, lam = float(torch.rand(1, generator=gen)), float(torch.rand(1, generator=gen))
    adv, ret = compute_gae(rewards, values, dones, next_values, gamma=gamma, lam=lam)
    exp_adv, exp_ret = ref.gae(rewards.tolist(), values.tolist(), dones.tolist(), next_values.tolist(), gamma, lam)
    close(adv, exp_adv)
    close(ret, exp_ret)
    adv, _ = compute_gae(
        rewards, values, dones, next_values, gamma=gamma, lam=lam, terminated=terminated, final_values=final_values
    )
    exp_adv, _ = ref.gae(
        rewards.tolist(), values.tolist(), dones.tolist(), next_values.tolist(), gamma, lam,
        terminated.tolist(), final_values.tolist(),
    )
    close(adv, exp_adv)
    discounts = gamma ** torch.randint(1, 5, (steps, envs), generator=gen).to(F64)  # chunks of 1-4 env steps
    adv, _ = compute_gae(rewards, values, dones, next_values, gamma=gamma, lam=lam, terminated=terminated,
                         final_values=final_values, discounts=discounts)
    exp_adv, _ = ref.gae(rewards.tolist(), values.tolist(), dones.tolist(), next_values.tolist(), gamma, lam,
                         terminated.tolist(), final_values.tolist(), discounts.tolist())
    close(adv, exp_adv)


@pytest.mark.parametrize("seed", SEEDS)
def test_token_estimators_match_loops(seed: int):
    gen = torch.Generator().manual_seed(seed)
    groups, per_group = int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(1, 5, (1,), generator=gen))
    batch, length = groups * per_group, int(torch.randint(1, 9, (1,), generator=gen))
    mask = random_mask(gen, batch, length)
    scores = torch.randint(0, 3, (batch,), generator=gen).to(F64)  # ties are common, as with 0/1 rewards
    ids = torch.randperm(batch, generator=gen) % groups  # groups need not be contiguous
    values = torch.randn(batch, length, generator=gen, dtype=F64)
    token_rewards = torch.randn(batch, length, generator=gen, dtype=F64)
    kl = torch.randn(batch, length, generator=gen, dtype=F64).abs()
    gamma, lam = float(torch.rand(1, generator=gen)), float(torch.rand(1, generator=gen))
    m, ids_l = mask.tolist(), ids.tolist()

    adv, ret = compute_token_gae(token_rewards, values, mask, gamma=gamma, lam=lam)
    exp_adv, exp_ret = ref.token_gae(token_rewards.tolist(), values.tolist(), m, gamma, lam)
    close(adv, exp_adv)
    close(ret, exp_ret)

    close(grpo_outcome_advantage(scores, group_index=ids), ref.grpo(scores.tolist(), ids_l))
    close(grpo_outcome_advantage(scores, group_index=ids, norm_by_std=False), ref.grpo(scores.tolist(), ids_l, False))
    close(rloo_advantage(scores, group_index=ids), ref.rloo(scores.tolist(), ids_l))

    adv, ret = reinforce_pp_advantage(token_rewards, mask, gamma=gamma)
    exp_adv, exp_ret = ref.reinforce_pp(token_rewards.tolist(), m, gamma)
    close(ret, exp_ret)
    close(adv, exp_adv, tol=1e-7)

    from m2flow.algorithms.estimators import TokenBatch, compute_advantages

    out = compute_advantages(
        "reinforce_pp_baseline", TokenBatch(mask, scores=scores, group_index=ids, kl=kl), gamma=gamma, kl_coef=0.1
    )
    exp_adv, _ = ref.reinforce_pp_baseline(scores.tolist(), ids_l, m, gamma, kl=kl.tolist(), kl_coef=0.1)
    close(out.advantages, exp_adv, tol=1e-7)


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_episodes_match_loop(seed: int):
    gen = torch.Generator().manual_seed(seed)
    steps, groups, per_group = (int(torch.randint(1, n, (1,), generator=gen)) for n in (10, 4, 4))
    envs = groups * per_group
    rewards = torch.randn(steps, envs, generator=gen, dtype=F64)
    dones = (torch.rand(steps, envs, generator=gen) < 0.2).to(F64)
    ids = torch.randperm(envs, generator=gen) % groups
    adv, returns, mask = grpo_episode_advantage(rewards, dones, group_index=ids)
    exp_adv, exp_returns, exp_mask = ref.grpo_episodes(rewards.tolist(), dones.tolist(), ids.tolist())
    close(returns, exp_returns)
    close(adv, exp_adv)
    assert mask.tolist() == exp_mask


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("seed", range(5))
def test_constant_reward_groups_have_zero_advantage(seed: int):
    gen = torch.Generator().manual_seed(seed)
    value = float(torch.randn(1, generator=gen))
    scores = torch.full((8,), value, dtype=F64)
    for fn in (grpo_outcome_advantage, rloo_advantage, group_baseline):
        assert torch.all(fn(scores, group_size=4) == 0), fn.__name__
    assert torch.all(grpo_outcome_advantage(scores, group_size=4, norm_by_std=False) == 0)
    rewards = torch.full((5, 6), value, dtype=F64)
    adv, _, _ = grpo_episode_advantage(rewards, torch.zeros(5, 6), group_size=3)
    assert torch.all(adv == 0)


def test_masked_positions_do_not_change_token_estimates():
    gen = torch.Generator().manual_seed(0)
    mask = random_mask(gen, 6, 7)
    rewards, values = torch.randn(6, 7, generator=gen, dtype=F64), torch.randn(6, 7, generator=gen, dtype=F64)
    junk = torch.where(mask.bool(), torch.zeros_like(rewards), torch.full_like(rewards, 1e6))
    for fn in (
        lambda r, v: compute_token_gae(r, v, mask, gamma=0.9, lam=0.8),
        lambda r, v: reinforce_pp_advantage(r, mask, gamma=0.9),
    ):
        clean, dirty = fn(rewards, values), fn(rewards + junk, values - junk)
        for a, b in zip(clean, dirty):
            close(a, b)
            assert torch.all(a[~mask.bool()] == 0)
