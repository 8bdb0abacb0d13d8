"""Action chunks in the actor's batch and PPO update: GAE over decisions, the PPO loss per chunk and per token
against hand-computed numbers, and log-probs recorded when sampling equal to those the actor recomputes."""

from __future__ import annotations

import math
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from m2flow.algorithms.advantages import compute_gae
from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.models.policy_types import ActOutput, EvalOutput
from m2flow.models.vla import VLAConfig
from m2flow.workers.embodied.batch import build_batch, decision_discounts
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.inference import PolicyEngine
from m2flow.workers.embodied.messages import Trajectory
from m2flow.workers.embodied.ppo import PPOUpdater
from tests.models.test_vla import packed_obs, small

torch.set_num_threads(1)

ACT = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


def vla_config(chunk: int, decoding: str = "parallel", logprob: str = "token") -> PolicyConfig:
    return PolicyConfig(kind="vla", vla=replace(small(), chunk=chunk, decoding=decoding, logprob=logprob))


def obs_space(config: VLAConfig) -> gym.Space:
    return gym.spaces.Box(0, 255, (config.layout().size,), np.uint8)


class FixedPolicy(nn.Module):
    """A policy whose log-probs and values are given numbers (plus 0 x a parameter, so the loss has a graph)."""

    def __init__(self, logprobs: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.logprobs, self.values = logprobs, values
        self.w = nn.Parameter(torch.zeros(()))

    def act(self, obs, deterministic=False, generator=None) -> ActOutput:
        raise NotImplementedError

    def evaluate(self, obs, actions) -> EvalOutput:
        zero = self.w * 0.0
        return EvalOutput(self.logprobs + zero, torch.zeros(len(obs)) + zero, self.values + zero)

    def value(self, obs):
        return self.values


# two decisions, each a chunk of 2 one-dimensional actions (2 tokens); old and new token log-probs
OLD = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
NEW = torch.tensor([[-0.9, -1.8], [-0.7, -0.6]])
ADV, VALUES, RETURNS = torch.tensor([1.0, -1.0]), torch.tensor([0.5, -0.5]), torch.tensor([1.0, 0.0])


@pytest.mark.parametrize("per", ["chunk", "token"])
def test_the_ppo_loss_by_hand(per: str):
    cfg = PPOConfig(clip=0.2, vf_coef=0.5, ent_coef=0.0)
    new, old = (NEW.sum(-1), OLD.sum(-1)) if per == "chunk" else (NEW, OLD)
    updater = PPOUpdater(FixedPolicy(new, VALUES), cfg)
    obs, actions = torch.zeros(2, 1), torch.zeros(2, 2, 1)
    loss, metrics = updater.minibatch_loss(obs, actions, old, ADV, RETURNS, VALUES.clone())
    value = 0.5 * ((0.5 - 1.0) ** 2 + (-0.5 - 0.0) ** 2) / 2  # vf_coef x the mean squared error: 0.125
    if per == "chunk":
        # decision 0: ratio exp(0.1 + 0.2) = 1.350, advantage 1: clipped to 1.2 -> -1.2
        # decision 1: ratio exp(-0.2 - 0.1) = 0.741, advantage -1: max(0.741, 0.8) -> +0.8
        expected = (-1.2 + 0.8) / 2
        clipped = 2 / 2
    else:
        # each token its own ratio with its decision's advantage, averaged over the 4 tokens:
        # exp(0.1) = 1.105 (inside), exp(0.2) = 1.221 -> 1.2; exp(-0.2) = 0.819, exp(-0.1) = 0.905 (inside, A = -1)
        expected = (-math.exp(0.1) - 1.2 + math.exp(-0.2) + math.exp(-0.1)) / 4
        clipped = 1 / 4
    assert float(metrics["actor/pg_loss"]) == pytest.approx(expected, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(expected + value, abs=1e-6)
    assert float(metrics["actor/clip_frac"]) == pytest.approx(clipped)


def trajectory(obs: np.ndarray, actions: np.ndarray, env_steps: np.ndarray | None, rank: int = 0) -> Trajectory:
    """T decisions of n envs, rewards 1 at every decision, no episode end."""
    t, n = actions.shape[:2]
    return Trajectory(env_rank=rank, iteration=0, obs=obs, actions=actions, rewards=np.ones((t, n), np.float32),
                      terminated=np.zeros((t, n), bool), truncated=np.zeros((t, n), bool),
                      final_index=np.zeros((0, 2), np.int64), final_obs=obs[:0, 0], last_obs=obs[-1],
                      env_steps=env_steps)


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_log_probs_recorded_when_sampling_equal_the_actors_recomputation(decoding: str):
    config = vla_config(chunk=2, decoding=decoding)
    space = obs_space(config.vla)
    torch.manual_seed(0)
    engine = PolicyEngine(space, ACT, config, seed=3, sources=[0])
    torch.manual_seed(1)
    actor = build_policy(space, ACT, config)
    actor.load_state_dict(engine.policy.state_dict())  # the weights the rollout acted with
    T, n = 3, 2
    obs = packed_obs(config.vla, T * n, seed=4).numpy().reshape(T, n, -1)
    recorded, actions = [], []
    for t in range(T):  # what the rollout does per decision, keeping the log-probs its policy gave
        out = engine.policy.act(torch.from_numpy(obs[t]), generator=engine.generators[0])
        recorded.append(out.logprobs)
        actions.append(out.actions.numpy())
    actions = np.stack(actions)
    assert actions.shape == (T, n, 2, 4)
    batch, _ = build_batch(actor, [trajectory(obs, actions, np.full((T, n), 2))], PPOConfig())
    torch.testing.assert_close(batch.logprobs, torch.cat(recorded), atol=1e-5, rtol=0)


def test_gae_runs_over_decisions_discounted_by_the_env_steps_between_them():
    config = vla_config(chunk=4)
    space = obs_space(config.vla)
    torch.manual_seed(0)
    policy = build_policy(space, ACT, config)
    T, n = 3, 2
    obs = packed_obs(config.vla, T * n).numpy().reshape(T, n, -1)
    actions = np.zeros((T, n, 4, 4), np.float32)
    steps = np.array([[4, 4], [4, 2], [4, 4]])
    a, b = trajectory(obs[:, :1], actions[:, :1], steps[:, :1]), trajectory(obs[:, 1:], actions[:, 1:], None, 1)
    gamma = 0.9
    discounts = decision_discounts([a, b], gamma, "cpu")
    torch.testing.assert_close(discounts, torch.tensor([[0.9**4, 0.9], [0.9**4, 0.9], [0.9**4, 0.9]]))
    assert decision_discounts([replace(a, env_steps=None)], gamma, "cpu") is None
    cfg = PPOConfig(gamma=gamma, gae_lambda=0.8)
    batch, _ = build_batch(policy, [trajectory(obs, actions, steps)], cfg)
    with torch.no_grad():
        values = policy.value(torch.from_numpy(obs.reshape(T * n, -1))).view(T, n)
        last = policy.value(torch.from_numpy(obs[-1]))
    expected, _ = compute_gae(torch.ones(T, n), values, torch.zeros(T, n), last, gamma=gamma, lam=0.8,
                              terminated=torch.zeros(T, n), final_values=torch.zeros(T, n),
                              discounts=torch.from_numpy(gamma ** steps.astype(np.float64)).float())
    torch.testing.assert_close(batch.advantages, expected.reshape(-1), atol=1e-5, rtol=0)
    # by hand, the last decision of env 1 (4 env steps, lambda irrelevant at the tail): 1 + 0.9^4 V(last) - V(s_2)
    assert float(batch.advantages[-1]) == pytest.approx(1 + 0.9**4 * float(last[1]) - float(values[2, 1]), abs=1e-5)
