"""The CPU-demand clock runs while a thread computes and stands still while it waits."""

from __future__ import annotations

import threading

from m2flow.runtime.cpu_clock import cpu_demand_s


def test_the_clock_counts_computing_and_not_waiting():
    t0 = cpu_demand_s()
    sum(i * i for i in range(300_000))
    t1 = cpu_demand_s()
    threading.Event().wait(0.5)
    t2 = cpu_demand_s()
    assert t1 > t0
    assert 0.0 <= t2 - t1 < 0.25  # half a second waited: the wake-up is all the clock may see of it
