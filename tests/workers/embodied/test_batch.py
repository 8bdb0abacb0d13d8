"""From trajectories to a PPO batch: old log-probs, values, and GAE with terminated vs truncated ends."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
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
