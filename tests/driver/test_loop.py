"""The one macro loop: what it asks of a flow, in which order, for every workflow."""

from __future__ import annotations

from pathlib import Path

from m2flow.driver.loop import Cadence, collect_horizon, train_loop


class FakeFlow:
    """Records what the loop asks: which iterations start at which step with which weights, what is
    trained, evaluated and saved (a ``Flow`` without workers)."""

    def __init__(self, max_staleness: int, iterations: int) -> None:
        self.max_staleness, self.iterations = max_staleness, iterations
        self.progress_total, self.description = iterations, "fake"
        self.started: dict[int, int] = {}  # iteration -> the weights version it started behind
        self.trained: list[int] = []
        self.evaluated: list[tuple[int, int]] = []  # (weights version, last iteration started)
        self.saved: list[int] = []
        self._next = 0

    def start(self, it: int, horizon: int) -> None:
        for j in range(max(self._next, it), horizon + 1):
            self.started[j] = it
        self._next = max(self._next, horizon + 1)

    def finish(self, it: int) -> dict[str, float]:
        assert it in self.started and it not in self.trained
        self.trained.append(it)
        return {"actor/loss": float(it)}

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        return {"time/step": seconds}

    def in_flight(self, it: int) -> bool:
        return self._next > it + 1

    def progress(self) -> int:
        return len(self.trained)

    def evaluate(self) -> dict[str, float]:
        self.evaluated.append((len(self.trained), self._next - 1))
        return {"eval/score": float(len(self.trained))}

    def save(self, next_it: int) -> Path:
        assert not self.in_flight(next_it - 1), "a checkpoint with work in flight"
        self.saved.append(next_it)
        return Path(".")


class _Logger:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append((step, dict(metrics)))


def test_the_horizon_stops_at_the_bound_and_before_a_drain():
    never = lambda it: False  # noqa: E731
    assert [collect_horizon(it, 0, never) for it in range(3)] == [0, 1, 2]
    assert [collect_horizon(it, 2, never) for it in range(3)] == [2, 3, 4]
    assert collect_horizon(3, 2, lambda it: it == 4) == 4  # nothing past iteration 4 before it is saved
    assert collect_horizon(4, 2, lambda it: it == 4) == 4


def test_every_iteration_starts_once_within_the_bound_and_drains_at_checkpoints_and_evaluations():
    flow, logger = FakeFlow(max_staleness=2, iterations=12), _Logger()
    out = train_loop(flow, Cadence(12, eval_every=6, checkpoint_every=4), 0, logger, flow.save)
    assert flow.trained == list(range(12)) and sorted(flow.started) == list(range(12))
    ages = {j: j - version for j, version in flow.started.items()}
    assert max(ages.values()) == 2 and all(a >= 0 for a in ages.values())
    assert ages[4] == 0 and ages[6] == 0 and ages[8] == 0  # right after a checkpoint or an evaluation
    assert flow.saved == [4, 8, 12]
    # the baseline, then after iterations 6 and 12: each sees the trained weights and nothing generated ahead
    assert flow.evaluated == [(0, -1), (6, 5), (12, 11)]
    assert [step for step, _ in out.evaluations] == [0, 6, 12]
    # one row per iteration at the flow's progress, the evaluation after it in the same row, the baseline alone
    assert [step for step, _ in logger.rows] == [0, *range(1, 13)]
    assert "eval/score" in logger.rows[6][1] and "eval/score" not in logger.rows[5][1]
    assert not out.stopped and len(out.history) == 12


def test_a_resumed_loop_evaluates_no_baseline_and_numbers_on():
    flow, logger = FakeFlow(max_staleness=0, iterations=6), _Logger()
    flow.trained = [0, 1, 2]
    flow._next = 3
    flow.started = {0: 0, 1: 1, 2: 2}
    train_loop(flow, Cadence(6, eval_every=3), 3, logger)
    assert flow.evaluated == [(6, 5)] and [step for step, _ in logger.rows] == [4, 5, 6]


def test_a_stop_trains_what_was_started_then_saves():
    flow = FakeFlow(max_staleness=2, iterations=10)
    calls = iter(range(100))
    out = train_loop(flow, Cadence(10, checkpoint_every=100), 0, _Logger(), flow.save,
                     stop=lambda: next(calls) >= 2)
    # the stop is seen after iteration 2, when 3 and 4 were already started: both are trained, 5 never starts
    assert out.stopped and flow.trained == [0, 1, 2, 3, 4] and sorted(flow.started) == [0, 1, 2, 3, 4]
    assert flow.saved == [5]


def test_watch_sees_every_iteration_and_constants_join_every_row():
    flow, logger = FakeFlow(max_staleness=0, iterations=4), _Logger()
    seen = []
    train_loop(flow, Cadence(4), 0, logger, watch=lambda it, m: seen.append(it) or it == 1,
               constants={"faults/restarts": 2.0})
    assert seen == [0, 1] and flow.trained == [0, 1]
    assert all(row["faults/restarts"] == 2.0 for _, row in logger.rows)
