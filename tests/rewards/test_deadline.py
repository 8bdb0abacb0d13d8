"""The deadline runner: one thread runs a batch in turn; a hung call is timed out and counted, a fresh thread
takes over the rest, and no thread is started per call."""

from __future__ import annotations

import gc
import pickle
import threading

import pytest

from m2flow.rewards.deadline import DeadlineRunner, call_with_deadline, under_deadline


def _where(tag: str) -> tuple[str, threading.Thread]:
    return tag, threading.current_thread()


def test_a_batch_runs_in_order_on_one_thread_not_the_callers():
    runner = DeadlineRunner(30.0)
    results = runner.run_all([(_where, (str(i),)) for i in range(5)])
    assert [r.status for r in results] == ["ok"] * 5
    assert [r.value[0] for r in results] == ["0", "1", "2", "3", "4"]
    threads = {r.value[1] for r in results}
    assert len(threads) == 1 and threading.current_thread() not in threads
    again = runner.run_all([(_where, ("5",))])
    assert again[0].value[1] in threads  # the same thread serves the next batch
    runner.close()


def test_a_call_that_raises_is_an_error_and_the_rest_still_run():
    results = DeadlineRunner(30.0).run_all([(int, ("1",)), (int, ("x",)), (int, ("3",))])
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert results[1].error.startswith("ValueError") and [results[0].value, results[2].value] == [1, 3]


def test_a_hung_call_among_fast_ones_is_timed_out_and_a_fresh_thread_runs_the_rest():
    release = threading.Event()
    hung_in: list[threading.Thread] = []

    def hang() -> str:
        hung_in.append(threading.current_thread())
        release.wait()
        return "late"

    runner = DeadlineRunner(0.5)
    try:
        results = runner.run_all([(_where, ("a",)), (hang, ()), (_where, ("b",)), (_where, ("c",))])
    finally:
        release.set()
    assert [r.status for r in results] == ["ok", "timeout", "ok", "ok"]
    assert "no result within 0.5s" in results[1].error and runner.abandoned == 1
    before, after = results[0].value[1], results[2].value[1]
    assert hung_in == [before] and after is not before and results[3].value[1] is after
    before.join(30)  # released, the abandoned thread drops its late result and exits
    assert not before.is_alive()
    assert runner.run_all([(_where, ("d",))])[0].value[1] is after  # the fresh thread stays the runner
    runner.close()


def test_no_thread_is_started_per_call():
    runner = DeadlineRunner(30.0)
    baseline = threading.active_count()
    seen = [runner.run_all([(_where, (str(k),))] * 10) for k in range(20)]
    threads = {r.value[1] for batch in seen for r in batch}
    assert len(threads) == 1 and threading.active_count() <= baseline + 1  # one runner thread for 200 calls
    runner.close()
    threads.pop().join(30)
    assert threading.active_count() <= baseline


def test_the_thread_exits_when_its_runner_is_collected_and_a_copy_starts_its_own():
    runner = DeadlineRunner(30.0)
    thread = runner.run_all([(threading.current_thread, ())])[0].value
    copy = pickle.loads(pickle.dumps(runner))
    assert copy.timeout_s == 30.0 and copy.run_all([(threading.current_thread, ())])[0].value is not thread
    del runner
    gc.collect()
    thread.join(30)
    assert not thread.is_alive()
    with pytest.raises(ValueError, match="timeout_s"):
        DeadlineRunner(0)


def test_calls_know_they_run_under_a_deadline():
    assert not under_deadline()
    assert DeadlineRunner(30.0).run_all([(under_deadline, ())])[0].value is True
    assert call_with_deadline(under_deadline, timeout_s=30.0).value is True
    assert call_with_deadline(under_deadline).value is False  # in the caller's thread, no limit


def _after(seconds: float, value):
    import time

    time.sleep(seconds)
    return value


def test_pending_calls_come_back_as_they_finish_and_the_wait_is_for_the_first():
    import time

    from m2flow.rewards.deadline import PendingCalls

    calls = PendingCalls(30.0)
    calls.start("slow", _after, 0.6, "s")
    calls.start("fast", _after, 0.05, "f")
    with pytest.raises(ValueError, match="out already"):
        calls.start("fast", _after, 0.0, "again")
    t0 = time.monotonic()
    first = calls.take()  # waits for the fast one only
    assert time.monotonic() - t0 < 0.5 and {k: r.value for k, r in first.items()} == {"fast": "f"}
    assert calls.out() == ["slow"]
    assert calls.take(wait=False) == {}  # nothing more yet, and no wait
    assert {k: r.value for k, r in calls.take().items()} == {"slow": "s"}
    assert calls.out() == [] and calls.take() == {}  # nothing out: no wait


def test_pending_calls_linger_takes_answers_that_come_close_together_in_one_take():
    from m2flow.rewards.deadline import PendingCalls

    calls = PendingCalls(30.0)
    for i, s in enumerate([0.02, 0.1, 0.15, 2.0]):
        calls.start(i, _after, s, i)
    got = calls.take(linger_s=0.5)
    assert sorted(got) == [0, 1, 2] and calls.out() == [3]  # not the 2 s one: past the linger
    calls.drop(3)


def test_a_pending_call_past_its_limit_comes_back_timed_out_and_its_late_result_is_dropped():
    import time

    from m2flow.rewards.deadline import PendingCalls

    calls = PendingCalls(0.2)
    calls.start("hung", _after, 0.5, "late")
    t0 = time.monotonic()
    got = calls.take()
    assert 0.15 < time.monotonic() - t0 < 0.45 and got["hung"].status == "timeout"
    time.sleep(0.4)  # the thread returns now: its result goes nowhere
    assert calls.take(wait=False) == {} and calls.out() == []
    calls.start("hung", _after, 0.0, "again")  # the key is free again
    assert calls.take()["hung"].value == "again"


def test_dropping_a_pending_call_waits_for_it_and_forgets_its_result():
    from m2flow.rewards.deadline import PendingCalls

    calls = PendingCalls(0.3)
    calls.start("a", _after, 0.05, 1)
    assert calls.drop("a") is True and calls.out() == [] and calls.take(wait=False) == {}
    calls.start("b", _after, 1.0, 2)
    assert calls.drop("b") is False  # did not end within its limit: abandoned
    assert calls.drop("never") is True
    with pytest.raises(ValueError):
        PendingCalls(0)
