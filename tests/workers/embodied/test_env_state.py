"""Env snapshots: a restored env continues exactly as the original."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from m2flow.workers.embodied.env_state import get_env_state, set_env_state
from m2flow.workers.state_file import load_state, save_state


def _continues_identically(env_id: str, tmp_path, steps: int = 200) -> None:
    a = gym.make(env_id, disable_env_checker=True)
    a.reset(seed=3)
    a.action_space.seed(0)
    for _ in range(7):
        a.step(a.action_space.sample())
    save_state(get_env_state(a), tmp_path / "env.pt")  # through a checkpoint file, loaded safely
    state = load_state(tmp_path / "env.pt")
    b = gym.make(env_id, disable_env_checker=True)
    b.reset(seed=99)  # a different episode, to be overwritten
    set_env_state(b, state)
    for _ in range(steps):
        action = a.action_space.sample()
        ra, rb = a.step(action), b.step(action)
        assert np.array_equal(ra[0], rb[0]) and ra[1:4] == rb[1:4]
        if ra[2] or ra[3]:
            assert np.array_equal(a.reset()[0], b.reset()[0])  # the env's generator was restored too


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_classic_control_envs_continue_exactly(env_id, tmp_path):
    _continues_identically(env_id, tmp_path)


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Ant-v5"])
def test_mujoco_envs_continue_exactly(env_id, tmp_path, monkeypatch):
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo may write its log file into the cwd
    _continues_identically(env_id, tmp_path, steps=60)


def test_a_snapshot_does_not_fit_another_wrapper_chain():
    state = get_env_state(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="wrapper layers"):
        set_env_state(gym.make("CartPole-v1").unwrapped, state)
