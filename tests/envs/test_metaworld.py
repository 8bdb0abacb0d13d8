"""MetaWorld pixel envs; skipped with the reason where metaworld or an offscreen OpenGL is missing."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs import EnvConfig, VecEnv
from m2flow.envs.factory import config_for_env, env_ids, env_spaces, make_env
from m2flow.envs.instructions import WordTokenizer
from m2flow.envs.metaworld import (
    HELD_OUT_SEED_BASE,
    MetaWorldPixelEnv,
    expand_tasks,
    held_out_seeds,
    metaworld_unavailable_reason,
)

REASON = metaworld_unavailable_reason()
needs_metaworld = pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")


@pytest.fixture(scope="module")
def reach():
    """One reach env, or a skip naming why no offscreen context could be made."""
    if REASON is not None:
        pytest.skip(f"MetaWorld pixels unavailable: {REASON}")
    try:
        env = MetaWorldPixelEnv("reach-v3", max_episode_steps=20)
    except Exception as error:  # noqa: BLE001 - a GL driver that loads but cannot make a context
        pytest.skip(f"no offscreen OpenGL context: {type(error).__name__}: {error}")
    yield env
    env.close()


def test_task_lists_expand_without_metaworld():
    assert expand_tasks("mt3") == ["reach-v3", "push-v3", "pick-place-v3"]
    assert expand_tasks("metaworld/reach-v3,push-v3") == ["reach-v3", "push-v3"]
    assert len(expand_tasks("mt10")) == 10
    with pytest.raises(ValueError, match="no instruction"):
        expand_tasks("reach-v3,fly-v3")
    cfg = EnvConfig(backend="metaworld", env_id="mt3")
    assert env_ids(cfg) == ["reach-v3", "push-v3", "pick-place-v3"]
    assert [config_for_env(cfg, i).env_id for i in range(4)] == ["reach-v3", "push-v3", "pick-place-v3", "reach-v3"]
    assert config_for_env(EnvConfig(), 3).env_id == "HalfCheetah-v5"  # other backends: unchanged
    assert min(held_out_seeds(5)) == HELD_OUT_SEED_BASE


@needs_metaworld
def test_observation_layout_instruction_and_proprio(reach):
    obs, info = reach.reset(seed=1)
    lay = reach.layout
    assert obs.shape == reach.observation_space.shape == (64 * 64 * 3 + 16 + 16,) and obs.dtype == np.uint8
    image, ids, proprio = lay.unpack(obs)
    assert image.shape == (64, 64, 3) and image.std() > 5  # a scene, not a blank frame
    assert WordTokenizer.versioned().decode(ids) == reach.instruction == "move the gripper to the red goal point"
    assert np.allclose(proprio, reach.state[:4])
    assert info == {"success": 0.0, "is_success": 0.0}


@needs_metaworld
def test_image_observations_are_the_packed_image_alone(reach):
    image_env = MetaWorldPixelEnv("reach-v3", max_episode_steps=20, observation="image")
    try:
        assert image_env.observation_space.shape == (64, 64, 3) and image_env.observation_space.dtype == np.uint8
        packed, _ = reach.reset(seed=3)
        image, _ = image_env.reset(seed=3)
        assert image.shape == (64, 64, 3) and np.array_equal(image, reach.layout.unpack(packed)[0])
        action = np.array([0.5, -0.3, 0.2, 0.0], dtype=np.float32)
        packed, r1, *_ = reach.step(action)
        image, r2, *_ = image_env.step(action)
        assert r1 == r2 and np.array_equal(image, reach.layout.unpack(packed)[0])
        quiet, *_ = image_env.step_without_render(action)  # the last frame again, a copy of its own
        assert np.array_equal(quiet, image) and quiet is not image
    finally:
        image_env.close()


@needs_metaworld
@pytest.mark.parametrize("kwargs", [{}, {"observation": "image", "height": 32, "width": 48},
                                    {"proprio": False, "text_len": 8, "max_episode_steps": 50}])
def test_spaces_without_building_are_the_built_envs(kwargs):
    cfg = EnvConfig(backend="metaworld", env_id="reach-v3", env_kwargs=kwargs)
    env = make_env(cfg)
    try:
        assert env_spaces(cfg) == (env.observation_space, env.action_space)
    finally:
        env.close()


@needs_metaworld
def test_corner_camera_is_rotated_right(reach):
    raw = MetaWorldPixelEnv("reach-v3", flip=False)
    try:
        a, _ = reach.reset(seed=4)
        b, _ = raw.reset(seed=4)
        flipped = reach.layout.unpack(a)[0]
        unflipped = raw.layout.unpack(b)[0]
        assert np.array_equal(flipped, unflipped[::-1, ::-1])
        assert not np.array_equal(flipped, unflipped)
    finally:
        raw.close()


@needs_metaworld
def test_seeded_resets_are_deterministic_and_seeds_differ(reach):
    actions = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)

    def rollout(seed):
        frames = [reach.reset(seed=seed)[0]]
        goal = reach.state[-3:].copy()  # the goal position drawn at reset
        frames += [reach.step(a)[0] for a in actions]
        return np.stack(frames), reach.state.copy(), goal

    first, state, goal = rollout(HELD_OUT_SEED_BASE)
    again, state_again, goal_again = rollout(HELD_OUT_SEED_BASE)
    _, _, other_goal = rollout(HELD_OUT_SEED_BASE + 1)
    assert np.array_equal(first, again) and np.array_equal(state, state_again) and np.array_equal(goal, goal_again)
    assert not np.allclose(goal, other_goal)


@needs_metaworld
def test_success_flag_reward_and_termination(reach):
    from m2flow.envs.metaworld_demos import expert_for

    expert = expert_for("reach-v3")
    env = MetaWorldPixelEnv("reach-v3", max_episode_steps=100)
    try:
        env.reset(seed=0)
        for _ in range(100):
            _, reward, term, trunc, info = env.step(expert.get_action(env.state))
            if term or trunc:
                break
        assert term and not trunc and info["success"] == 1.0 and info["is_success"] == 1.0 and reward == 1.0
    finally:
        env.close()
    reach.reset(seed=0)
    for _ in range(20):
        _, reward, term, trunc, info = reach.step(np.zeros(4, np.float32))
    assert trunc and not term and info["success"] == 0.0 and reward == 0.0  # a still arm times out
    assert info["is_success"] == 0.0


def test_success_bonus_pays_for_the_steps_left(reach):
    from m2flow.envs.metaworld_demos import expert_for

    expert = expert_for("reach-v3")
    env = MetaWorldPixelEnv("reach-v3", max_episode_steps=100, reward="dense", success_bonus=True)
    try:
        env.reset(seed=0)
        rewards = []
        for _ in range(100):
            _, reward, term, trunc, _ = env.step(expert.get_action(env.state))
            rewards.append(reward)
            if term or trunc:
                break
        assert term and not trunc and len(rewards) < 100
        steps_left = 100 - len(rewards)
        assert all(0.0 <= r <= 1.0 for r in rewards[:-1])
        assert steps_left <= rewards[-1] <= steps_left + 1.0  # the step's own shaped reward plus one per step left
    finally:
        env.close()
    with pytest.raises(ValueError, match="success_bonus: needs terminate_on_success"):
        MetaWorldPixelEnv("reach-v3", terminate_on_success=False, success_bonus=True)


@needs_metaworld
def test_multi_task_vector_env_tells_tasks_apart_by_instruction_only():
    cfg = EnvConfig(backend="metaworld", env_id="mt3", num_envs=3, num_groups=3, normalize_obs=False,
                    normalize_reward=False, info_keys=["success"], max_episode_steps=3)
    try:
        vec = VecEnv(cfg)
    except RuntimeError as error:
        pytest.skip(f"no offscreen OpenGL context: {error}")
    try:
        obs = vec.reset()
        tasks = [g.envs[0].task for g in vec.groups]
        assert tasks == ["reach-v3", "push-v3", "pick-place-v3"]
        lay = vec.groups[0].envs[0].layout
        ids = lay.unpack(obs)[1]
        assert len({tuple(row) for row in ids}) == 3
        for _ in range(3):
            res = vec.step(np.zeros((3, 4), np.float32))
        assert res.truncated.all() and (res.infos["success"] == 0).all()
        assert make_env(cfg).task == "reach-v3"  # a probe builds the first task
    finally:
        vec.close()


@needs_metaworld
def test_bad_settings_fail_naming_them():
    with pytest.raises(ValueError, match="no instruction for task 'fly-v3'"):
        make_env(EnvConfig(backend="metaworld", env_id="fly-v3"))
    with pytest.raises(ValueError, match="camera"):
        MetaWorldPixelEnv("reach-v3", camera="nope")
    with pytest.raises(ValueError, match="max_episode_steps"):
        MetaWorldPixelEnv("reach-v3", max_episode_steps=10_000)
    with pytest.raises(ValueError, match="observation"):
        MetaWorldPixelEnv("reach-v3", observation="state")
    # The spaces read without building an env check the arguments as the constructor does.
    with pytest.raises(TypeError, match="colour"):
        env_spaces(EnvConfig(backend="metaworld", env_id="reach-v3", env_kwargs={"colour": "red"}))
    with pytest.raises(ValueError, match="observation"):
        env_spaces(EnvConfig(backend="metaworld", env_id="reach-v3", env_kwargs={"observation": "state"}))
    with pytest.raises(ValueError, match="'fly-v3' is not a MetaWorld v3 task"):  # a sentence does not make a task
        make_env(EnvConfig(backend="metaworld", env_id="fly-v3", env_kwargs={"instruction": "fly"}))


@needs_metaworld
def test_a_task_outside_mt10_reads_its_own_or_the_given_instruction():
    own = make_env(EnvConfig(backend="metaworld", env_id="handle-press-v3", env_kwargs={"height": 32, "width": 32}))
    given = make_env(EnvConfig(backend="metaworld", env_id="handle-press-v3",
                               env_kwargs={"height": 32, "width": 32, "instruction": "press the red handle down"}))
    try:
        tok = WordTokenizer.versioned()
        assert tok.decode(own.layout.unpack(own.reset(seed=0)[0])[1]) == "press the handle down"
        assert tok.decode(given.layout.unpack(given.reset(seed=0)[0])[1]) == "press the red handle down"
    finally:
        own.close()
        given.close()


def test_gl_backend_choice_and_the_reason_without_one(monkeypatch):
    import m2flow.envs.metaworld as mw

    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert mw.gl_backend() == "osmesa"
    monkeypatch.delenv("MUJOCO_GL")
    monkeypatch.setattr(mw.ctypes.util, "find_library", lambda name: "libOSMesa.so" if name == "OSMesa" else None)
    assert mw.gl_backend() == "osmesa"
    monkeypatch.setattr(mw.ctypes.util, "find_library", lambda name: None)
    assert mw.gl_backend() is None
    reason = mw.metaworld_unavailable_reason()
    assert reason is not None and ("OpenGL" in reason or "metaworld" in reason)
    with pytest.raises(RuntimeError, match="'metaworld' is unavailable"):
        MetaWorldPixelEnv("reach-v3")


def _frames(envs, seeds=None, steps=6):
    rng = np.random.default_rng(0)
    out = [env.reset(seed=s)[0] for s, env in zip(seeds or range(len(envs)), envs)]
    for _ in range(steps):
        out += [env.step(rng.uniform(-1, 1, 4))[0] for env in envs]
    return np.stack(out)


@needs_metaworld
def test_envs_of_a_process_share_a_render_context_and_render_the_same_frames(reach, monkeypatch):
    """Two reach envs and a drawer env: the reach envs share one context (its textures uploaded once), the drawer
    env's own assets get another; every frame equals the frame rendered with a context per env; a context is
    freed with its last env."""
    from m2flow.envs import metaworld

    def build():
        return [MetaWorldPixelEnv(task, max_episode_steps=20) for task in ("reach-v3", "drawer-close-v3", "reach-v3")]

    before, users = dict(metaworld._thread_contexts()), reach._camera._shared.users
    envs = build()
    ours = [env._camera._shared for env in envs]
    assert ours[0] is ours[2] is reach._camera._shared and ours[1] is not ours[0]
    assert ours[0].users == users + 2 and ours[1].users == 1  # with the fixture's reach env
    shared = _frames(envs)

    keys = iter(range(1_000_000))
    monkeypatch.setattr(metaworld, "_asset_key", lambda model: f"own-{next(keys)}")
    apart = build()
    assert len({id(env._camera._shared) for env in apart}) == 3
    np.testing.assert_array_equal(_frames(apart), shared)
    for env in apart:
        env.close()

    envs[1].close()
    assert ours[1].gl is None  # its last user is gone
    envs[0].close()
    assert ours[0].gl is not None and ours[0].users == users + 1
    again = _frames([envs[2]], seeds=[2], steps=0)  # the survivor renders on: its first frame as before
    np.testing.assert_array_equal(again[0], shared[2])
    envs[2].close()
    assert dict(metaworld._thread_contexts()) == before
    with pytest.raises(RuntimeError, match="closed"):
        envs[2]._camera.render(envs[2].simulator.data)


@needs_metaworld
def test_each_thread_renders_through_contexts_of_its_own(reach):
    """An OpenGL context is current in one thread at a time: an env built in another thread (a worker of the
    in-process executor) gets a context of its own and renders there, the same frame as this thread's env."""
    import threading

    seen = {}

    def other():
        env = MetaWorldPixelEnv("reach-v3", max_episode_steps=20)
        seen["context"], seen["frame"] = env._camera._shared, env.reset(seed=3)[0]
        env.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen["context"] is not reach._camera._shared and seen["context"].gl is None  # freed with its env
    np.testing.assert_array_equal(seen["frame"], reach.reset(seed=3)[0])


@needs_metaworld
def test_a_context_left_current_in_an_ended_thread_is_freed_at_exit_quietly():
    """Envs built in a thread that ended without closing them (a worker thread dropped at a run's end): the exit
    hook, in another thread, cannot make their context current; it destroys the context without raising."""
    import threading

    from m2flow.envs import metaworld

    left = {}

    def worker():
        env = MetaWorldPixelEnv("reach-v3", max_episode_steps=20)
        env.reset(seed=0)
        left["env"], left["context"] = env, env._camera._shared

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert left["context"] in set(metaworld._LIVE_CONTEXTS)
    left["context"].free()  # what the exit hook runs for each live context
    assert left["context"].gl is None and left["context"] not in set(metaworld._LIVE_CONTEXTS)


@needs_metaworld
def test_a_forked_child_makes_contexts_of_its_own(reach, monkeypatch):
    """A process forked after an env was built inherits the parent's contexts, which are not its own: its envs
    make new ones (as seen through another process id)."""
    import os

    from m2flow.envs import metaworld

    parent = reach._camera._shared
    monkeypatch.setattr(metaworld.os, "getpid", lambda: os.getppid() + 10**7)
    child = MetaWorldPixelEnv("reach-v3", max_episode_steps=20)
    try:
        assert child._camera._shared is not parent
    finally:
        child.close()
    monkeypatch.undo()
    assert metaworld._thread_contexts().get(parent.key) is not parent  # the child's took its place here ...
    again = MetaWorldPixelEnv("reach-v3", max_episode_steps=20)  # ... and a later env makes one anew
    np.testing.assert_array_equal(again.reset(seed=1)[0], reach.reset(seed=1)[0])
    again.close()
