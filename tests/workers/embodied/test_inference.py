"""The rollout-side policy copy: sampling per source, batching, determinism."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch

from m2flow.models.policies import PolicyConfig
from m2flow.workers.embodied.inference import PolicyEngine

torch.set_num_threads(1)
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def _engine(action_space, sources=(0, 1), seed=0):
    return PolicyEngine(OBS, action_space, PolicyConfig(hidden_sizes=[8]), seed, sources)


def test_actions_of_a_source_do_not_depend_on_batching_with_others():
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    obs = [np.random.default_rng(i).standard_normal((4, 3)).astype(np.float32) for i in range(2)]
    alone = _engine(box)
    together = _engine(box)
    torch.manual_seed(0)
    weights = _engine(box).policy.state_dict()
    alone.load_weights(weights)
    together.load_weights(weights)
    a0, a1 = alone.act(obs[0], 0), alone.act(obs[1], 1)
    b0, b1 = together.act_many(obs, [0, 1])
    assert np.allclose(a0, b0, atol=1e-6) and np.allclose(a1, b1, atol=1e-6)
    assert a0.dtype == np.float32 and a0.shape == (4, 2)


def test_deterministic_actions_are_the_mean_and_sampling_follows_the_std():
    box = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    engine = _engine(box, sources=(0,))
    weights = engine.policy.state_dict()
    weights["head.log_std"] = torch.full((1,), np.log(0.5))
    engine.load_weights(weights)
    obs = np.zeros((5000, 3), np.float32)
    mean = engine.act(obs[:1], 0, deterministic=True)
    samples = engine.act(obs, 0)
    assert abs(samples.std() - 0.5) < 0.03
    assert abs(samples.mean() - mean.item()) < 0.03


def test_categorical_actions_and_restored_generators_repeat_themselves():
    engine = _engine(gym.spaces.Discrete(5), sources=(3,))
    obs = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    state = copy.deepcopy(engine.rng_state())
    first = engine.act(obs, 3)
    assert first.dtype == np.int64 and first.min() >= 0 and first.max() < 5
    engine.load_rng_state(state)
    assert np.array_equal(engine.act(obs, 3), first)


def test_numpy_and_torch_forward_passes_agree():
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    engine = _engine(box, sources=(0,))
    assert engine._use_numpy
    obs = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    fast = engine.act(obs, 0, deterministic=True)
    engine._use_numpy, engine._numpy = False, None
    slow = engine.act(obs, 0, deterministic=True)
    assert np.allclose(fast, slow, atol=1e-5)
