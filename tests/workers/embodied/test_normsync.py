"""Merging normalisation statistics across env ranks equals statistics over all their samples."""

from __future__ import annotations

import numpy as np

from m2flow.envs import EnvConfig, RunningMeanStd, VecEnv
from m2flow.workers.embodied.normsync import NormSync, moments_between


def test_moments_between_recovers_the_added_samples():
    rms = RunningMeanStd((3,))
    rng = np.random.default_rng(0)
    rms.update(rng.normal(5.0, 2.0, (50, 3)))
    before = rms.state_dict()
    added = rng.normal(-1.0, 0.5, (20, 3))
    rms.update(added)
    mean, var, count = moments_between(before, rms.state_dict())
    assert count == 20
    assert np.allclose(mean, added.mean(0)) and np.allclose(var, added.var(0))
    assert moments_between(rms.state_dict(), rms.state_dict()) is None


def test_two_ranks_end_with_the_statistics_of_all_samples():
    cfg = EnvConfig(env_id="CartPole-v1", num_envs=2)
    ranks = [VecEnv(cfg, rank=r) for r in range(2)]
    syncs = [NormSync(v) for v in ranks]  # both start from empty statistics
    rng = np.random.default_rng(0)
    seen: list[np.ndarray] = []
    for _ in range(2):  # two iterations: merge, then merge again on top
        for r, v in enumerate(ranks):
            for _ in range(5):
                batch = rng.normal(r, 1.0 + r, (2, 4))
                v.obs_normalizer(batch)
                seen.append(batch)
        deltas = [s.delta() for s in syncs]
        for s in syncs:
            s.merge(deltas)
    everything = np.concatenate(seen)
    for v in ranks:
        rms = v.obs_normalizer.rms
        assert rms.count == len(everything)
        assert np.allclose(rms.mean, everything.mean(0)) and np.allclose(rms.var, everything.var(0))
    assert np.array_equal(ranks[0].obs_normalizer.rms.mean, ranks[1].obs_normalizer.rms.mean)


def test_merged_ranks_hold_the_statistics_of_one_rank_with_all_envs():
    # As an env worker does: each rank resets its envs (folding in their first observations) before
    # its NormSync exists. After a merge both ranks must hold the statistics of one vector of all
    # the envs stepped the same way, reset observations of every rank included.
    one = VecEnv(EnvConfig(env_id="CartPole-v1", num_envs=4))
    two = [VecEnv(EnvConfig(env_id="CartPole-v1", num_envs=2), rank=r) for r in range(2)]
    one.reset()
    for v in two:
        v.reset()
    syncs = [NormSync(v) for v in two]
    rng = np.random.default_rng(0)
    for _ in range(2):  # two iterations of 30 steps, a merge after each
        for _ in range(30):
            actions = rng.integers(0, 2, size=4)
            one.step(actions)
            for r, v in enumerate(two):
                v.step(actions[2 * r:2 * r + 2])
        deltas = [s.delta() for s in syncs]
        for s in syncs:
            s.merge(deltas)
        for v in two:
            for piece in ("obs_normalizer", "reward_scaler"):
                got, want = getattr(v, piece).rms, getattr(one, piece).rms
                assert got.count == want.count
                assert np.allclose(got.mean, want.mean) and np.allclose(got.var, want.var)
    assert np.array_equal(two[0].obs_normalizer.rms.mean, two[1].obs_normalizer.rms.mean)
