"""MetaWorld's step without a frame (the actions inside a chunk): the same physics and rewards as ``step``,
no render until the episode ends; skipped with the reason where metaworld or an offscreen OpenGL is missing."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs.metaworld import MetaWorldPixelEnv, metaworld_unavailable_reason
from m2flow.envs.vector import EnvGroup

REASON = metaworld_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")


class Counter:
    """Wraps a camera's ``render``, counting its calls."""

    def __init__(self, env: MetaWorldPixelEnv) -> None:
        self.calls = 0
        self._render = env._camera.render
        env._camera.render = self

    def __call__(self, data):
        self.calls += 1
        return self._render(data)


def _env(max_steps: int = 6) -> MetaWorldPixelEnv:
    try:
        return MetaWorldPixelEnv("reach-v3", height=32, width=32, max_episode_steps=max_steps, reward="dense")
    except Exception as error:  # noqa: BLE001 - a GL driver that loads but cannot make a context
        pytest.skip(f"no offscreen OpenGL context: {type(error).__name__}: {error}")


def test_a_quiet_step_moves_the_physics_as_step_does_without_a_frame():
    loud, quiet = _env(), _env()
    try:
        counter = Counter(quiet)
        first, _ = loud.reset(seed=5)
        assert np.array_equal(quiet.reset(seed=5)[0], first) and counter.calls == 1
        actions = np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)
        for a in actions[:3]:
            o_loud, r_loud, *_ = loud.step(a)
            o_quiet, r_quiet, term, trunc, _ = quiet.step_without_render(a)
            assert r_quiet == r_loud and not (term or trunc)
            np.testing.assert_array_equal(quiet.state, loud.state)
            layout = quiet.layout
            assert np.array_equal(layout.unpack(o_quiet)[0], layout.unpack(first)[0])  # the stale image
            np.testing.assert_array_equal(layout.unpack(o_quiet)[2], layout.unpack(o_loud)[2])  # fresh proprio
        assert counter.calls == 1  # no frame inside the chunk
        o_loud, r_loud, *_ = loud.step(actions[3])
        o_quiet, r_quiet, *_ = quiet.step(actions[3])
        assert counter.calls == 2 and r_quiet == r_loud and np.array_equal(o_quiet, o_loud)
        # the episode (6 steps) ends on a quiet step: its last observation is rendered
        quiet.step_without_render(actions[0])
        o_end, _, _, truncated, _ = quiet.step_without_render(actions[1])
        assert truncated and counter.calls == 3
    finally:
        loud.close()
        quiet.close()


def test_an_env_group_renders_one_frame_per_chunk():
    env = _env(max_steps=50)
    try:
        group = EnvGroup([env], first_index=0)
        group.reset([3])
        counter = Counter(env)
        for _ in range(3):
            res = group.step_chunk(np.zeros((1, 4, 4), np.float32), discount=0.99)
            assert res.env_steps.tolist() == [4]
        assert counter.calls == 3  # 12 env steps, 3 decisions, 3 frames
    finally:
        env.close()
