from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs.normalize import ObsNormalizer, RewardScaler, RunningMeanStd


def test_running_moments_match_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 7, 30, 2)]
    rms = RunningMeanStd((4,))
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(rms.var, data.var(axis=0), rtol=1e-12)
    assert rms.count == 40


def test_merging_ranks_equals_all_data():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(10, 3)), rng.normal(5.0, 0.1, size=(25, 3))
    left, right = RunningMeanStd((3,)), RunningMeanStd((3,))
    left.update(a)
    right.update(b)
    left.update_from_moments(right.mean, right.var, right.count)
    both = np.concatenate([a, b])
    np.testing.assert_allclose(left.mean, both.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(left.var, both.var(axis=0), rtol=1e-12)


def test_state_dict_round_trip_is_a_copy():
    rms = RunningMeanStd((2,))
    rms.update(np.array([[1.0, 2.0], [3.0, 6.0]]))
    state = rms.state_dict()
    rms.update(np.array([[100.0, 100.0]]))
    restored = RunningMeanStd((2,))
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.mean, [2.0, 4.0])
    np.testing.assert_array_equal(restored.var, [1.0, 4.0])
    assert restored.count == 2.0
    with pytest.raises(ValueError, match="shape"):
        RunningMeanStd((3,)).load_state_dict(state)


def test_obs_normalizer_formula_clip_and_freeze():
    norm = ObsNormalizer((2,), clip=1.5, epsilon=0.0)
    out = norm(np.array([[0.0, 10.0], [2.0, 30.0]]))
    # mean (1, 20), std (1, 10) -> each row is exactly one std away.
    np.testing.assert_allclose(out, [[-1.0, -1.0], [1.0, 1.0]])
    assert out.dtype == np.float32
    np.testing.assert_allclose(norm.normalize(np.array([[5.0, 20.0]])), [[1.5, 0.0]])  # clipped
    before = norm.state_dict()["rms"]["count"]
    norm(np.array([[7.0, 7.0]]), update=False)
    assert norm.rms.count == before


def test_reward_scaler_hand_computed():
    gamma, eps = 0.5, 0.0
    scaler = RewardScaler(num_envs=2, gamma=gamma, clip=100.0, epsilon=eps)
    # step 1: returns (1, 2); step 2: env 0 continues -> 1*.5+3 = 3.5, env 1 -> 2*.5+2 = 3 and ends.
    scaler(np.array([1.0, 2.0]), np.array([False, False]))
    out = scaler(np.array([3.0, 2.0]), np.array([False, True]))
    seen = np.array([1.0, 2.0, 3.5, 3.0])
    np.testing.assert_allclose(out, np.array([3.0, 2.0]) / seen.std(), rtol=1e-6)
    np.testing.assert_allclose(scaler.returns, [3.5, 0.0])
    # A group of envs updates only its own running returns.
    scaler(np.array([4.0]), np.array([False]), envs=slice(1, 2))
    np.testing.assert_allclose(scaler.returns, [3.5, 4.0])


def test_reward_scaler_frozen_and_state_round_trip():
    scaler = RewardScaler(num_envs=3, gamma=0.9)
    for r in ([1.0, 2.0, 3.0], [0.5, -1.0, 2.0]):
        scaler(np.array(r), np.zeros(3, bool))
    state = scaler.state_dict()
    frozen = scaler(np.array([1.0, 1.0, 1.0]), np.zeros(3, bool), update=False)
    assert scaler.rms.count == 6
    other = RewardScaler(num_envs=3, gamma=0.9)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.returns, scaler.returns)
    np.testing.assert_array_equal(
        other(np.array([1.0, 1.0, 1.0]), np.zeros(3, bool), update=False), frozen
    )
    with pytest.raises(ValueError, match="envs"):
        RewardScaler(num_envs=2).load_state_dict(state)


def test_obs_normalizer_follows_statistics_replaced_from_outside():
    norm = ObsNormalizer((1,), clip=100.0, epsilon=0.0)
    norm(np.array([[0.0], [2.0]]))
    assert norm.normalize(np.array([[3.0]]))[0, 0] == pytest.approx(2.0)
    norm.rms.load_state_dict({"mean": np.array([1.0]), "var": np.array([4.0]), "count": 9.0})
    assert norm.normalize(np.array([[3.0]]))[0, 0] == pytest.approx(1.0)
    norm.rms.var = np.array([0.25])  # direct assignment, as a statistics merge might do
    assert norm.normalize(np.array([[3.0]]))[0, 0] == pytest.approx(4.0)
