"""How much of a span of wall time the calling thread spent wanting a core: computing, or runnable and
waiting for one.

A component's busy seconds mix computing with waiting (a tool's latency, a remote environment, a
sleep). The planner's CPU-contention rule must slow only the computing: so the busy time is measured
with this clock beside the wall clock, and their ratio is the component's CPU share. On Linux the
clock reads the thread's scheduler statistics (``/proc/thread-self/schedstat``: nanoseconds on a core,
nanoseconds runnable on a run queue), so time lost to other processes on a busy machine still counts
as wanting a core; elsewhere it is the thread's CPU time alone (``time.thread_time``).
"""

from __future__ import annotations

import time
from pathlib import Path

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def cpu_demand_s() -> float:
    """Seconds the calling thread has spent on a core or runnable waiting for one (a running total)."""
    try:
        on_core, queued = _SCHEDSTAT.read_text().split()[:2]
    except (OSError, ValueError):
        return time.thread_time()
    return (int(on_core) + int(queued)) * 1e-9
