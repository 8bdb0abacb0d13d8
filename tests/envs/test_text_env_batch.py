"""A batch of text environments survives environments that raise, hang or return bad values, and counts them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from m2flow.envs.text import TextEnvBatch
from m2flow.runtime.errors import RunHealthError


class Scripted:
    """Steps as told by ``mode``: 'ok' (ends after 2 steps), 'raise', 'hang', 'bad_obs', 'bad_reward', 'bad_reset'."""

    released = threading.Event()

    def __init__(self, mode: str = "ok") -> None:
        self.mode, self.steps = mode, 0

    def reset(self, seed: int | None = None) -> tuple[Any, dict]:
        self.steps = 0
        if self.mode == "bad_reset":
            return None, {}
        return f"start {seed}", {}

    def step(self, action: str) -> tuple[Any, Any, bool, bool, dict]:
        self.steps += 1
        if self.mode == "raise":
            raise KeyError("boom")
        if self.mode == "hang":
            self.released.wait()
        if self.mode == "bad_obs":
            return ["not", "text"], 0.0, False, False, {}
        if self.mode == "bad_reward":
            return "x", float("nan"), False, False, {}
        return f"echo {action}", 1.0, self.steps >= 2, False, {}


def _batch(modes: list[str], **kwargs: Any) -> TextEnvBatch:
    pending = iter(modes)
    return TextEnvBatch(lambda: Scripted(next(pending, "ok")), len(modes), name="scripted", **kwargs)


@pytest.fixture(autouse=True)
def _release_hung_threads():
    Scripted.released.clear()
    yield
    Scripted.released.set()


def test_running_envs_step_and_finished_ones_stop():
    batch = _batch(["ok", "ok"])
    assert [s.observation for s in batch.reset([1, 2])] == ["start 1", "start 2"]
    first = batch.step({0: "a", 1: "b"})
    assert first[0].observation == "echo a" and not first[0].done and batch.running == [True, True]
    assert batch.step({0: "c"})[0].terminated and batch.running == [False, True]
    with pytest.raises(ValueError, match="env 0 \\(scripted\\) is not running"):
        batch.step({0: "d"})
    stats = batch.pop_stats()
    assert (stats.resets, stats.steps, stats.episodes, stats.failures) == (2, 3, 1, 0)


def test_each_kind_of_failure_ends_only_its_episode_and_is_counted():
    batch = _batch(["raise", "hang", "bad_obs", "bad_reward", "ok"], step_timeout_s=0.2, max_error_rate=1.0)
    batch.reset([0] * 5)
    out = batch.step({i: "go" for i in range(5)})
    assert "raised KeyError: 'boom'" in out[0].error
    assert "gave no result within 0.2s" in out[1].error
    assert out[2].error == "step returned a list observation, not str"
    assert "not a finite number" in out[3].error
    assert not out[4].error and batch.running == [False, False, False, False, True]
    stats = batch.pop_stats()
    assert (stats.raised, stats.timeouts, stats.bad_outputs) == (1, 1, 2)
    batch.check_health(stats)  # max_error_rate 1.0: tolerated


def test_a_hung_env_is_replaced_at_the_next_reset():
    batch = _batch(["hang", "ok"], step_timeout_s=0.2)
    batch.reset([0, 0])
    hung = batch.envs[0]
    batch.step({0: "go"})
    batch.reset([1, 1])
    assert batch.envs[0] is not hung and batch.stats.replaced == 1 and batch.running == [True, True]


def test_a_bad_reset_ends_the_episode_before_it_starts():
    batch = _batch(["bad_reset", "ok"])
    first = batch.reset([0, 0])
    assert first[0].error == "reset returned a NoneType observation, not str" and batch.running == [False, True]


def test_failures_past_the_limit_stop_the_run_naming_the_limit():
    batch = _batch(["raise", "ok", "ok", "ok"], max_error_rate=0.1)
    batch.reset([0] * 4)
    batch.step({i: "go" for i in range(4)})
    with pytest.raises(RunHealthError, match=r"scripted: 1 of 8 environment calls failed in iteration 3 \(1 raised, "
                                             r"0 timed out, 0 returned bad values\), more than max_error_rate=0.1; "
                                             r"the last: env 0 \(scripted\): step raised KeyError"):
        batch.check_health(batch.pop_stats(), "in iteration 3")


def test_from_registry_checks_the_name_and_settings_at_once():
    with pytest.raises(KeyError, match="valid names"):
        TextEnvBatch.from_registry("nope", 2)
    with pytest.raises(TypeError):
        TextEnvBatch.from_registry("guess_number", 2, env_kwargs={"colour": "red"})
    assert len(TextEnvBatch.from_registry("guess_number", 3, env_kwargs={"high": 10})) == 3


class _Meeting:
    """A step that returns only once every environment of the batch is inside its own step."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def reset(self, seed=None):
        return "meet", {}

    def step(self, action):
        self.barrier.wait()
        return "met", 1.0, True, False, {}


def test_concurrent_stepping_runs_the_steps_side_by_side():
    barrier = threading.Barrier(4)
    batch = TextEnvBatch(lambda: _Meeting(barrier), 4, step_timeout_s=60.0, concurrent=True)
    batch.reset([0] * 4)
    assert [s.observation for s in batch.step({i: "go" for i in range(4)}).values()] == ["met"] * 4
    with pytest.raises(ValueError, match="needs a step_timeout_s"):
        TextEnvBatch(lambda: _Meeting(barrier), 1, step_timeout_s=None, concurrent=True)


def test_a_hung_env_among_fast_ones_ends_only_its_episode_and_the_rest_step_on():
    batch = _batch(["ok", "hang", "ok", "ok"], step_timeout_s=0.5, max_error_rate=1.0)
    batch.reset([0] * 4)
    out = batch.step({i: str(i) for i in range(4)})
    assert [out[i].observation for i in (0, 2, 3)] == ["echo 0", "echo 2", "echo 3"] and out[1].error
    assert batch.running == [True, False, True, True] and batch.stats.timeouts == 1
    assert batch.step({0: "x", 2: "y"})[2].terminated  # the next step runs on the fresh thread
    batch.reset([1] * 4)
    assert batch.stats.replaced == 1 and batch.running == [True] * 4


class _Where:
    """Records the thread each of its steps ran on."""

    threads: list[threading.Thread] = []

    def reset(self, seed=None):
        return "here", {}

    def step(self, action):
        self.threads.append(threading.current_thread())
        return "there", 0.0, False, False, {}


def test_stepping_starts_no_thread_per_call():
    batch = TextEnvBatch(_Where, 8, step_timeout_s=30.0)
    _Where.threads.clear()
    for k in range(30):
        batch.reset([k] * 8)
        batch.step({i: "a" for i in range(8)})
    assert len(_Where.threads) == 240 and len(set(_Where.threads)) == 1  # one thread ran every step
    assert _Where.threads[0] is not threading.current_thread()  # and it is not the caller's


class Waits:
    """A tool-like environment: every step waits 0.3 s for an answer and computes almost nothing."""

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        return "start", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        threading.Event().wait(0.3)
        return "answer", 0.0, False, False, {}


class Computes(Waits):
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        sum(i * i for i in range(200_000))
        return "answer", 0.0, False, False, {}


@pytest.mark.parametrize("concurrent", [False, True])
def test_the_cpu_the_calls_wanted_is_counted_and_a_wait_is_not(concurrent):
    waits = TextEnvBatch(Waits, 2, step_timeout_s=5.0, concurrent=concurrent)
    waits.reset([0, 1])
    waits.step({0: "a", 1: "b"})
    stats = waits.pop_stats()
    assert 0.0 < stats.cpu_s < 0.3  # two steps of 0.3 s waited; what they computed is a small part of it
    assert "env/cpu_s" not in stats.as_metrics()  # a timing, not a count
    computes = TextEnvBatch(Computes, 2, step_timeout_s=5.0, concurrent=concurrent)
    computes.reset([0, 1])
    before = computes.stats.cpu_s
    computes.step({0: "a", 1: "b"})
    assert computes.pop_stats().cpu_s > before


class Slow(Scripted):
    """Scripted 'ok' whose every step waits ``wait_s`` first (a tool with latency)."""

    def __init__(self, wait_s: float) -> None:
        super().__init__("ok")
        self.wait_s = wait_s

    def step(self, action: str) -> tuple[Any, Any, bool, bool, dict]:
        import time

        time.sleep(self.wait_s)
        return super().step(action)


def test_sent_steps_come_back_as_they_answer_and_the_slow_one_stays_out():
    waits = iter([0.0, 0.02, 0.8])
    envs = TextEnvBatch(lambda: Slow(next(waits)), 3, name="slow", step_timeout_s=10.0, concurrent=True)
    envs.reset([0, 1, 2])
    envs.send({0: "a", 1: "b", 2: "c"})
    with pytest.raises(ValueError, match="has a step out"):
        envs.send({2: "again"})
    got = envs.receive(linger_s=0.3)
    assert sorted(got) == [0, 1] and got[0].observation == "echo a" and envs.stepping() == [2]
    envs.send({0: "a2"})  # episode 0 plays on while env 2's step is still out
    got = envs.receive()
    assert got[0].terminated and envs.stepping() == [2] and not envs.running[0]
    assert envs.receive()[2].observation == "echo c" and envs.stepping() == []
    assert envs.pop_stats().steps == 4


def test_a_sent_step_past_its_limit_ends_its_episode_and_a_reset_drops_a_step_still_out():
    envs = _batch(["hang", "ok"], step_timeout_s=0.3, concurrent=True)
    envs.reset([0, 1])
    envs.send({0: "x", 1: "y"})
    first = envs.receive()
    assert list(first) == [1] and envs.stepping() == [0]
    late = envs.receive()
    assert late[0].error and "no result within" in late[0].error and not envs.running[0]
    assert envs.pop_stats().timeouts == 1
    envs.reset([0, 1])  # the hung env is replaced
    envs.send({1: "z"})
    envs.reset_some({1: 5})  # a reset of an env with a step out drops that step's answer
    assert envs.stepping() == [] and envs.receive() == {}
    with pytest.raises(ValueError, match="step_timeout_s"):
        TextEnvBatch(lambda: Scripted(), 1, step_timeout_s=None).send({0: "x"})
