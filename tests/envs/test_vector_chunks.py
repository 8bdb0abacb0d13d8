"""Action chunks in an env group (``EnvGroup.step_chunk`` / ``VecEnv.step_group_chunk``): the actions a chunk
executes, its discounted reward, an episode ending inside it, and one render per decision."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from m2flow.envs import EnvConfig, VecEnv
from m2flow.envs.vector import EnvGroup


class RenderCountingEnv(gym.Env):
    """reward = 10 * t + action after the t-th step; ends (terminated) after ``end_at`` steps. ``step`` renders a
    frame (counted), ``step_without_render`` does not, unless the episode ends there."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, end_at: int = 100, quiet: bool = True) -> None:
        self.end_at = end_at
        self.renders = 0
        self.executed: list[float] = []
        self.t = 0
        if not quiet:  # an env that cannot skip its frame: every step renders
            self.step_without_render = None

    def _frame(self) -> np.ndarray:
        self.renders += 1
        return np.array([self.t, self.renders], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _advance(self, action):
        self.executed.append(float(np.asarray(action).reshape(-1)[0]))
        self.t += 1
        return 10.0 * self.t + self.executed[-1], self.t == self.end_at, False, {"t": float(self.t)}

    def step(self, action):
        reward, term, trunc, info = self._advance(action)
        return self._frame(), reward, term, trunc, info

    def step_without_render(self, action):
        reward, term, trunc, info = self._advance(action)
        obs = self._frame() if term or trunc else np.array([self.t, -1.0])
        return obs, reward, term, trunc, info


def chunk(*values: float) -> np.ndarray:
    """One env's chunk of 1-dimensional actions, (K, 1)."""
    return np.array(values, dtype=np.float32).reshape(-1, 1)


def test_a_chunk_executes_its_actions_in_order_with_one_render_per_decision():
    envs = [RenderCountingEnv(), RenderCountingEnv()]
    group = EnvGroup(envs, first_index=0)
    group.reset()
    assert [e.renders for e in envs] == [1, 1]
    res = group.step_chunk(np.stack([chunk(0.1, 0.2, 0.3, 0.4), chunk(-0.1, -0.2, -0.3, -0.4)]), discount=0.5)
    assert envs[0].executed == pytest.approx([0.1, 0.2, 0.3, 0.4]) and envs[1].executed == pytest.approx(
        [-0.1, -0.2, -0.3, -0.4])
    assert [e.renders for e in envs] == [2, 2]  # the reset's frame and the one after the chunk
    # rewards 10t + a, summed with 0.5^j: 10.1 + 0.5 * 20.2 + 0.25 * 30.3 + 0.125 * 40.4
    assert res.reward[0] == pytest.approx(10.1 + 10.1 + 7.575 + 5.05)
    assert res.raw_reward[1] == pytest.approx(9.9 + 0.5 * 19.8 + 0.25 * 29.7 + 0.125 * 39.6)
    assert res.env_steps.tolist() == [4, 4] and not res.done.any()
    assert res.obs[:, 0].tolist() == [4, 4] and res.obs[:, 1].tolist() == [2, 2]  # the rendered frame
    assert res.infos == {}
    for step in range(3):  # three more decisions: still one frame each
        group.step_chunk(np.zeros((2, 4, 1), np.float32))
    assert [e.renders for e in envs] == [5, 5] and [len(e.executed) for e in envs] == [16, 16]


def test_an_episode_ending_inside_a_chunk_ends_the_chunk():
    envs = [RenderCountingEnv(end_at=2), RenderCountingEnv(end_at=100)]
    group = EnvGroup(envs, first_index=3, info_keys=("t",))
    group.reset()
    res = group.step_chunk(np.stack([chunk(0.5, 0.5, 0.5), chunk(0.0, 0.0, 0.0)]), discount=0.9)
    assert envs[0].executed == [0.5, 0.5]  # the third action was not executed
    assert res.env_steps.tolist() == [2, 3]
    assert res.terminated.tolist() == [True, False]
    assert res.reward[0] == pytest.approx(10.5 + 0.9 * 20.5)
    assert res.reward[1] == pytest.approx(10 + 0.9 * 20 + 0.81 * 30)
    # the episode's own statistics: undiscounted raw return over its env steps, at the worker index
    assert res.episode_env.tolist() == [3] and res.episode_length.tolist() == [2]
    assert res.episode_return.tolist() == pytest.approx([10.5 + 20.5])
    assert res.next_obs[0, 0] == 2 and res.obs[0, 0] == 0  # the true last frame; the next episode's first
    assert res.infos["t"].tolist() == [2.0, 3.0]  # the last executed step's
    # env 0: its reset, the last frame of the episode (rendered where it ended) and the new episode's reset
    assert envs[0].renders == 3 and envs[1].renders == 2
    res = group.step_chunk(np.stack([chunk(0.0, 0.0, 0.0), chunk(0.0, 0.0, 0.0)]), discount=0.9)
    assert res.env_steps.tolist() == [2, 3] and res.episode_length.tolist() == [2]  # the next episode's own count


def test_an_env_without_a_quiet_step_renders_every_step_and_the_same_numbers_come_out():
    quiet, loud = RenderCountingEnv(), RenderCountingEnv(quiet=False)
    a, b = EnvGroup([quiet], 0), EnvGroup([loud], 0)
    a.reset(), b.reset()
    actions = np.stack([chunk(0.1, -0.3, 0.7)])
    ra, rb = a.step_chunk(actions, 0.99), b.step_chunk(actions, 0.99)
    assert ra.reward.tolist() == rb.reward.tolist() and ra.env_steps.tolist() == rb.env_steps.tolist()
    assert quiet.renders == 2 and loud.renders == 4


def test_vec_env_chunks_per_group_normalise_and_record_episodes():
    name = "M2flowTest/RenderCounting-v0"
    gym.register(id=name, entry_point=RenderCountingEnv, kwargs={"end_at": 3})
    try:
        vec = VecEnv(EnvConfig(env_id=name, num_envs=4, num_groups=2, normalize_obs=False, normalize_reward=False))
        vec.reset()
        res = vec.step_group_chunk(1, np.zeros((2, 2, 1), np.float32), discount=1.0)
        assert res.group == 1 and res.env_steps.tolist() == [2, 2] and res.reward.tolist() == [30.0, 30.0]
        res = vec.step_chunk(np.zeros((4, 2, 1), np.float32))  # group 0: 2 steps; group 1: ends after 1
        assert res.env_steps.tolist() == [2, 2, 1, 1] and res.episode_env.tolist() == [2, 3]
        assert list(vec.episodes) == [(60.0, 3), (60.0, 3)]
        with pytest.raises(ValueError, match="chunk of actions"):
            vec.step_group_chunk(0, np.zeros(2, np.float32))
    finally:
        del gym.registry[name]
