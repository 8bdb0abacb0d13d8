"""Timers add up block times under ``time/`` names."""

from __future__ import annotations

import m2flow.metrics.timing as timing
from m2flow.metrics import Timings, timer


class FakeClock:
    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0)


def test_timer_adds_block_times(monkeypatch):
    monkeypatch.setattr(timing.time, "perf_counter", FakeClock(10.0, 10.25, 20.0, 20.5))
    out: dict[str, float] = {}
    with timer("time/step", out):
        pass
    assert out == {"time/step": 0.25}
    with timer("time/step", out):
        pass
    assert out == {"time/step": 0.75}


def test_timer_records_even_when_the_block_raises(monkeypatch):
    monkeypatch.setattr(timing.time, "perf_counter", FakeClock(1.0, 3.0))
    out: dict[str, float] = {}
    try:
        with timer("time/fail", out):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert out == {"time/fail": 2.0}


def test_timings_pop_starts_afresh(monkeypatch):
    monkeypatch.setattr(timing.time, "perf_counter", FakeClock(0.0, 1.0, 1.5, 2.0, 5.0, 7.0))
    t = Timings()
    with t("time/a"):
        with t("time/b"):
            pass
    assert t.pop() == {"time/a": 2.0, "time/b": 0.5}
    with t("time/a"):
        pass
    assert t.pop() == {"time/a": 2.0}
    assert t.pop() == {}
