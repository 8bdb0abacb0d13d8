"""An env that raises in step or reset is reset and counted; one whose reset keeps raising stops the run."""

from __future__ import annotations

import numpy as np
import pytest

import tests.workers.embodied.toy_envs  # noqa: F401 - registers the toy envs
from m2flow.envs import EnvConfig, VecEnv
from m2flow.runtime.errors import RunHealthError


def _flaky(num_envs: int = 2, **kwargs) -> VecEnv:
    return VecEnv(EnvConfig(env_id="M2flowToy/Flaky-v0", num_envs=num_envs, normalize_obs=False,
                            normalize_reward=False, env_kwargs=kwargs))


def test_a_step_that_raises_ends_that_episode_resets_the_env_and_is_counted():
    vec = _flaky(step_every=5)
    vec.reset()
    ended = 0
    for t in range(1, 21):
        res = vec.step(np.zeros(2, dtype=np.int64))
        if t % 5 == 0:  # both envs raise on their 5th, 10th... step
            assert res.terminated.tolist() == [True, True] and res.reward.tolist() == [0.0, 0.0]
        ended += res.episode_env.size
    count, last = vec.pop_errors()
    assert count == 8 and "env 1 (M2flowToy/Flaky-v0) step raised SimulatorError: step 20 failed" in last
    assert vec.pop_errors() == (0, "")
    # The broken episodes are not among the statistics: only the ones that ended by themselves.
    assert len(vec.episodes) == ended


def test_a_reset_that_raises_is_tried_again_and_counted():
    vec = _flaky(num_envs=1, reset_every=2)  # the 2nd, 4th... resets raise
    vec.reset()
    for _ in range(40):  # action 0 ends most episodes: many resets
        vec.step(np.zeros(1, dtype=np.int64))
    count, last = vec.pop_errors()
    assert count > 0 and "reset raised SimulatorError" in last
    assert count == vec.groups[0].envs[0].unwrapped.resets // 2


def test_a_reset_that_always_raises_stops_with_the_env_id():
    vec = _flaky(num_envs=1, reset_every=1)
    with pytest.raises(RunHealthError, match=r"env 0 \(M2flowToy/Flaky-v0\) raised in reset 3 times in a row"):
        vec.reset()
