"""From trajectories to a PPO batch: old log-probs, values, and GAE with terminated vs truncated ends."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.workers.embodied.batch import build_batch
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.messages import Trajectory

torch.set_num_threads(1)
OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def _constant_value_policy(value: float):
    policy = build_policy(OBS, ACT, PolicyConfig(hidden_sizes=[4]))
    with torch.no_grad():
        policy.value_head.weight.zero_()
        policy.value_head.bias.fill_(value)
    return policy


def _traj(rank: int, n: int = 2) -> Trajectory:
    T = 3
    terminated = np.zeros((T, n), bool)
    truncated = np.zeros((T, n), bool)
    terminated[1, 0] = True  # env 0 ends in a terminal state at t = 1
    truncated[1, 1] = True  # env 1 hits the time limit at t = 1
    rng = np.random.default_rng(rank)
    return Trajectory(
        env_rank=rank, iteration=0,
        obs=rng.standard_normal((T, n, 2)).astype(np.float32),
        actions=rng.standard_normal((T, n, 1)).astype(np.float32),
        rewards=np.ones((T, n), np.float32), terminated=terminated, truncated=truncated,
        final_index=np.array([[1, 1]]), final_obs=np.zeros((1, 2), np.float32),
        last_obs=np.zeros((n, 2), np.float32),
    )


def test_gae_bootstraps_truncation_but_not_termination():
    # gamma 0.5, lambda 1, V = 2 everywhere; hand-computed (see the delta of each step):
    # env 0: t2: 1 + .5*2 - 2 = 0; t1 (terminated): 1 - 2 = -1; t0: 0 + .5 * -1 = -0.5
    # env 1: t2: 0; t1 (truncated, V(final) = 2): 1 + .5*2 - 2 = 0; t0: 0
    cfg = PPOConfig(gamma=0.5, gae_lambda=1.0)
    batch, metrics = build_batch(_constant_value_policy(2.0), [_traj(0)], cfg)
    adv = batch.advantages.view(3, 2)
    assert torch.allclose(adv[:, 0], torch.tensor([-0.5, -1.0, 0.0]))
    assert torch.allclose(adv[:, 1], torch.tensor([0.0, 0.0, 0.0]))
    assert torch.allclose(batch.returns, batch.advantages + 2.0)
    assert torch.allclose(batch.values, torch.full((6,), 2.0))
    assert metrics["actor/batch_size"] == 6.0


def test_without_a_critic_advantages_are_discounted_returns():
    cfg = PPOConfig(gamma=0.5, use_critic=False)
    batch, _ = build_batch(_constant_value_policy(2.0), [_traj(0)], cfg)
    adv = batch.advantages.view(3, 2)
    # every episode piece is cut at t = 1 and the tail is not bootstrapped: 1.5, 1, 1 for both envs
    assert torch.allclose(adv, torch.tensor([[1.5, 1.5], [1.0, 1.0], [1.0, 1.0]]))
    assert torch.count_nonzero(batch.values) == 0


def test_ranks_join_along_the_env_axis_and_log_probs_match_the_policy():
    policy = _constant_value_policy(0.0)
    trajs = [_traj(0), _traj(1, n=3)]
    batch, _ = build_batch(policy, trajs, PPOConfig())
    assert batch.obs.shape == (3 * 5, 2)
    # sample t * N + e: env 2 of the join is env 0 of rank 1
    assert torch.equal(batch.obs.view(3, 5, 2)[:, 2], torch.from_numpy(trajs[1].obs[:, 0]))
    ref = policy.evaluate(batch.obs, batch.actions)
    assert torch.allclose(batch.logprobs, ref.logprobs, atol=1e-6)


def test_grpo_scores_each_envs_first_episode_within_its_group_and_drops_the_rest():
    # Two ranks of 2 envs, groups of 2: rank 0's envs form group 0, rank 1's group 1. Rewards 1 per step.
    # Rank 0: env 0 ends at t = 1 (return 2), env 1 at t = 0 (return 1); rank 1: neither ends (return 3 each).
    T, n = 3, 2
    trajs = []
    for rank, ends in ((0, {0: 1, 1: 0}), (1, {})):
        terminated = np.zeros((T, n), bool)
        for env, t in ends.items():
            terminated[t, env] = True
        traj = _traj(rank)
        traj.terminated, traj.truncated = terminated, np.zeros((T, n), bool)
        traj.final_index, traj.final_obs = np.zeros((0, 2), np.int64), np.zeros((0, 2), np.float32)
        trajs.append(traj)
    cfg = PPOConfig(advantage="grpo", group_size=2, use_critic=False)
    batch, metrics = build_batch(_constant_value_policy(2.0), trajs, cfg)
    # kept (t, env) in flat order t * 4 + env: env 0 at t 0-1, env 1 at t 0, envs 2-3 at t 0-2
    assert metrics["actor/batch_size"] == 2 + 1 + 3 + 3 == len(batch)
    std = float(torch.tensor([2.0, 1.0]).std())
    expected = torch.tensor([1, -1, 0, 0,   1, 0, 0,   0, 0]) * 0.5 / std  # (2 - 1.5) / std, (1 - 1.5) / std
    assert torch.allclose(batch.advantages, expected.float(), atol=1e-5)
    assert torch.equal(batch.values, torch.zeros(9))
    assert metrics["actor/advantage_mean"] == pytest.approx(float(expected.mean()), abs=1e-6)  # dropped steps not in it


def test_grpo_group_seeds_are_shared_within_a_group_only():
    from m2flow.workers.embodied.env import group_seeds

    ranks = [group_seeds(0, 5, r, 4, 2) for r in range(2)]
    flat = [s for part in ranks for s in part]
    assert flat[0] == flat[1] and flat[2] == flat[3] and flat[4] == flat[5]
    assert len(set(flat)) == 4
    assert group_seeds(0, 6, 0, 4, 2) != ranks[0] and group_seeds(1, 5, 0, 4, 2) != ranks[0]
