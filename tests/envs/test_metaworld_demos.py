from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs.metaworld import metaworld_unavailable_reason
from m2flow.envs.metaworld_demos import Demos, collect_demos, evaluate_success

REASON = metaworld_unavailable_reason()
needs_metaworld = pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")


def fake_demos(n: int = 6) -> Demos:
    return Demos(obs=np.arange(n * 10, dtype=np.uint8).reshape(n, 10), actions=np.zeros((n, 4), np.float32),
                 episode=np.array([0] * (n // 2) + [1] * (n - n // 2)), tasks=np.array(["reach-v3", "push-v3"]),
                 seeds=np.array([0, 1]), success=np.array([True, True]))


def test_demos_round_trip_and_bad_files_are_named(tmp_path):
    path = fake_demos().save(tmp_path / "d.npz")
    back = Demos.load(path)
    assert np.array_equal(back.obs, fake_demos().obs) and back.tasks.tolist() == ["reach-v3", "push-v3"]
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="junk.npz"):
        Demos.load(junk)
    partial = tmp_path / "partial.npz"
    np.savez(partial, obs=np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="partial.npz"):
        Demos.load(partial)
    bad = fake_demos()
    bad.episode[0] = 7
    with pytest.raises(ValueError, match="episode"):
        Demos.load(bad.save(tmp_path / "bad.npz"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz", "d.npz", "junk.npz", "partial.npz"]  # no leftovers
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, obs=np.array([object()]), actions=np.zeros(1), episode=np.zeros(1), tasks=np.array(["a"]),
             seeds=np.zeros(1), success=np.zeros(1))
    with pytest.raises(ValueError, match="pickled.npz"):  # object arrays are never unpickled
        Demos.load(pickled)


@needs_metaworld
def test_expert_demos_are_seeded_and_successful(tmp_path):
    try:
        demos = collect_demos(["reach-v3"], 2, seed=5, env_kwargs={"height": 32, "width": 32})
    except RuntimeError as error:
        pytest.skip(f"no offscreen OpenGL context: {error}")
    assert demos.success.all() and demos.seeds.tolist() == [5, 6]
    assert demos.obs.shape[1] == 32 * 32 * 3 + 16 + 16 and len(demos.actions) == len(demos)
    assert np.abs(demos.actions).max() <= 1.0 and set(demos.episode.tolist()) == {0, 1}
    assert not np.array_equal(demos.obs[demos.episode == 0][0], demos.obs[demos.episode == 1][0])  # two seeds
    # A still arm never succeeds; every (task, seed) pair is counted.
    rates = evaluate_success(lambda obs: np.zeros((len(obs), 4), np.float32), ["reach-v3", "push-v3"], [0],
                             env_kwargs={"height": 32, "width": 32, "max_episode_steps": 5})
    assert rates == {"reach-v3": 0.0, "push-v3": 0.0}


@needs_metaworld
def test_parallel_evaluation_plays_the_same_episodes():
    def recorder(seen: set[bytes]):
        def act(obs: np.ndarray) -> np.ndarray:
            seen.update(row.tobytes() for row in obs)
            # a deterministic function of the observation: the proprio bytes steer the arm
            return np.tanh(obs[:, -16:-12].astype(np.float32) / 64.0 - 2.0)
        return act

    kwargs = {"height": 32, "width": 32, "max_episode_steps": 6}
    one, three = set(), set()
    a = evaluate_success(recorder(one), ["reach-v3"], [5, 6, 7], env_kwargs=kwargs)
    b = evaluate_success(recorder(three), ["reach-v3"], [5, 6, 7], env_kwargs=kwargs, parallel=3)
    assert a == b and one == three and len(one) > 3


@needs_metaworld
def test_chunks_of_actions_are_executed_in_order_and_read_the_frame_after_the_chunk():
    """A policy returning (B, K, 4) chunks plays the episodes a policy repeating one action for K steps plays."""
    def rule(obs: np.ndarray) -> np.ndarray:
        return np.tanh(obs[:, -16:-12].astype(np.float32) / 64.0 - 2.0)

    def chunked(seen: list[bytes], k: int):
        def act(obs: np.ndarray) -> np.ndarray:
            seen.extend(row.tobytes() for row in obs)
            return np.repeat(rule(obs)[:, None], k, axis=1)  # (B, K, 4)
        return act

    def repeating(seen: list[bytes], k: int):
        calls = {"n": 0, "last": None}

        def act(obs: np.ndarray) -> np.ndarray:
            if calls["n"] % k == 0:  # a new decision every k steps; the frames between are not read
                seen.extend(row.tobytes() for row in obs)
                calls["last"] = rule(obs)
            calls["n"] += 1
            return calls["last"]
        return act

    kwargs = {"height": 32, "width": 32, "max_episode_steps": 7}
    a, b = [], []
    evaluate_success(chunked(a, 3), ["reach-v3"], [5], env_kwargs=kwargs)
    evaluate_success(repeating(b, 3), ["reach-v3"], [5], env_kwargs=kwargs)
    assert len(a) == 3 and a == b  # decisions at steps 0, 3 and 6: the last chunk cut by the episode's end


def test_processes_writing_the_same_demos_file_at_once_leave_a_whole_one(tmp_path):
    # Runs of several seeds may each make the task's demonstrations; every write goes beside the file and is
    # renamed over it, so no reader sees a half-written file and the last rename leaves a whole one.
    import multiprocessing

    path = tmp_path / "same.npz"
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=fake_demos(600).save, args=(path,)) for _ in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert all(w.exitcode == 0 for w in writers)
    assert np.array_equal(Demos.load(path).obs, fake_demos(600).obs)
    assert [p.name for p in tmp_path.iterdir()] == ["same.npz"]

