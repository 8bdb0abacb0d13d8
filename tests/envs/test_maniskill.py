from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs import EnvConfig, VecEnv
from m2flow.envs.maniskill import maniskill_unavailable_reason

REASON = maniskill_unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"ManiSkill unavailable: {REASON}")
def test_pick_cube_state_obs_on_cpu():
    env = VecEnv(
        EnvConfig(env_id="PickCube-v1", backend="maniskill", num_envs=2, num_groups=2, max_episode_steps=4)
    )
    obs = env.reset()
    assert obs.ndim == 2 and obs.shape[0] == 2 and obs.dtype == np.float32
    act = np.zeros((2, *env.single_action_space.shape), np.float32)
    for _ in range(4):
        res = env.step(act)
    assert res.truncated.all()
    env.close()


@pytest.mark.skipif(REASON is None, reason="ManiSkill is available here")
def test_unavailable_backend_fails_with_the_reason():
    with pytest.raises(RuntimeError, match="'maniskill' is unavailable"):
        VecEnv(EnvConfig(env_id="PickCube-v1", backend="maniskill", num_envs=1))
