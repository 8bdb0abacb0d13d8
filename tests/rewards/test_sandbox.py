"""Sandboxed checks: time limits, crashes and errors are counted and scored 0, never raised."""

from __future__ import annotations

import time

import pytest

from m2flow.rewards.sandbox import SandboxPool, VerifyStats, score_batch
from tests.rewards import sandbox_checks as checks


@pytest.fixture(scope="module")
def pool():
    # A generous default limit so that ordinary checks never time out on a loaded machine; the
    # tests about hangs pass their own short limit.
    with SandboxPool(num_workers=2, timeout_s=30.0) as p:
        yield p


def test_ordinary_calls_return_values(pool: SandboxPool):
    results, stats = pool.map(checks.equal_check, [("a", "a"), ("a", "b"), ("c", "c")])
    assert [r.status for r in results] == ["ok"] * 3
    assert [r.value for r in results] == [1.0, 0.0, 1.0]
    assert (stats.total, stats.sandboxed, stats.failures, stats.restarts) == (3, 3, 0, 0)


def test_hung_check_is_cut_off_and_counted(pool: SandboxPool):
    scores, stats = score_batch(
        ["x", "y", "z"], ["x", "y", "z"], pool=pool, check=checks.slow_check, timeout_s=0.5
    )
    assert scores == [0.0, 0.0, 0.0]
    assert stats.timeouts == 3 and stats.restarts == 3 and stats.errors == stats.crashes == 0
    # The replaced workers serve the next batch.
    scores, stats = score_batch(["a", "b"], ["a", "a"], pool=pool, check=checks.equal_check)
    assert scores == [1.0, 0.0] and stats.failures == 0


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{9^{9^{9^9}}}",  # a power tower: sympy would build an integer of ~10**8 digits, then more
        r"\boxed{" + "(" * 30 + "1" + ")" * 30 + "}",  # deep nesting: the LaTeX parser backtracks for minutes
    ],
)
def test_pathological_expression_scores_zero_within_its_limit(pool: SandboxPool, response: str):
    start = time.perf_counter()
    scores, stats = score_batch([response], ["1"], pool=pool, timeout_s=1.0)
    elapsed = time.perf_counter() - start
    assert scores == [0.0]
    assert stats.sandboxed == 1 and stats.timeouts == 1 and stats.restarts == 1
    assert elapsed < 1.0 + 2.0  # the limit, plus killing and replacing the worker on a loaded machine
    scores, stats = score_batch([r"\boxed{2\sqrt{2}}"], [r"\sqrt{8}"], pool=pool)
    assert scores == [1.0] and stats.failures == 0


def test_crashing_check_is_counted_and_pool_recovers(pool: SandboxPool):
    pids_before = {r.value for r in pool.map(checks.worker_pid, [("", "")] * 4)[0]}
    scores, stats = score_batch(["a", "b", "c"], ["a", "b", "c"], pool=pool, check=checks.crashing_check)
    assert scores == [0.0, 0.0, 0.0]
    assert stats.crashes == 3 and stats.restarts == 3
    results, stats = pool.map(checks.worker_pid, [("", "")] * 4)
    assert all(r.status == "ok" for r in results) and stats.failures == 0
    assert not {r.value for r in results} & pids_before  # fresh processes


def test_errors_and_non_numbers_score_zero(pool: SandboxPool):
    scores, stats = score_batch(["a"], ["a"], pool=pool, check=checks.raising_check)
    assert scores == [0.0] and stats.errors == 1
    results, _ = pool.map(checks.raising_check, [("a", "a")])
    assert results[0].status == "error" and "RuntimeError: checker bug" in results[0].error
    scores, stats = score_batch(["a"], ["a"], pool=pool, check=checks.text_check)
    assert scores == [0.0] and stats.invalid == 1 and stats.errors == 0


def test_math_batch_uses_the_fast_path_for_plain_integers(pool: SandboxPool):
    responses = ["work...\n#### 18", "#### 1,080", "17", "The answer is 18.", r"\boxed{2\sqrt{2}}", r"\boxed{x+}"]
    references = ["#### 18", "#### 1080", "#### 18", "#### 18", r"\sqrt{8}", "x"]
    scores, stats = score_batch(responses, references, pool=pool)
    assert scores == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert (stats.total, stats.in_process, stats.sandboxed, stats.failures) == (6, 3, 3, 0)
    # Everything through the sandbox gives the same scores.
    slow, stats = score_batch(responses, references, pool=pool, in_process_fast_path=False)
    assert slow == scores and stats.sandboxed == 6


def test_worker_killed_while_idle_is_replaced(pool: SandboxPool):
    victim = pool._workers[0].process
    victim.kill()
    victim.join()
    results, stats = pool.map(checks.equal_check, [("a", "a")] * 3)
    assert [r.value for r in results] == [1.0] * 3 and stats.restarts == 1 and stats.failures == 0


def test_unpicklable_check_is_a_clear_error(pool: SandboxPool):
    with pytest.raises(TypeError, match="picklable top-level functions"):
        pool.map(lambda a, b: 1.0, [("a", "a")])


def test_workers_are_recycled_after_max_tasks():
    with SandboxPool(num_workers=1, timeout_s=30.0, max_tasks_per_worker=2) as pool:
        results, stats = pool.map(checks.worker_pid, [("", "")] * 6)
    pids = [r.value for r in results]
    assert len(set(pids)) == 3 and stats.restarts == 3


def test_stats_add_up_and_export_metrics():
    total = VerifyStats()
    total += VerifyStats(total=2, in_process=1, sandboxed=1, timeouts=1)
    total += VerifyStats(total=3, sandboxed=3, errors=1, crashes=1)
    assert (total.total, total.sandboxed, total.failures) == (5, 4, 3)
    metrics = total.as_metrics()
    assert metrics["reward/verify_timeouts"] == 1.0 and metrics["reward/verify_total"] == 5.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        score_batch(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="num_workers"):
        SandboxPool(num_workers=0)
    pool = SandboxPool(num_workers=1)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.map(checks.equal_check, [("a", "a")])


@pytest.mark.parametrize(("share", "workers"), [("1", 1), ("2", 2), ("8", 2)])
def test_the_default_pool_takes_the_process_share_of_the_cores(monkeypatch, share: str, workers: int):
    """A rank given one thread gets one sandbox host (a second would compete for its core), else two."""
    from m2flow.rewards.sandbox import _default_workers

    monkeypatch.setenv("OMP_NUM_THREADS", share)
    assert _default_workers() == workers
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert _default_workers() == 1
