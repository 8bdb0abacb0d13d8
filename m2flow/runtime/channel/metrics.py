"""Per-channel measurements: queue depth over time and how long puts and gets waited."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from m2flow.runtime.trace import Tracer, get_tracer


@dataclass
class WaitStats:
    """Count, total and worst wait in seconds."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0


@dataclass
class ChannelMetrics:
    """A snapshot of one channel's counters; ``depth`` holds ``(seconds since creation, items)``."""

    name: str
    items_in: int = 0
    items_out: int = 0
    bytes_in: int = 0
    max_depth: int = 0
    put_wait: WaitStats = field(default_factory=WaitStats)  # producers blocked on a full channel
    get_wait: WaitStats = field(default_factory=WaitStats)  # consumers blocked on an empty channel
    depth: list[tuple[float, int]] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Flat scalars named by prefix, ready for a metrics sink."""
        p = f"channel/{self.name}/"
        return {
            p + "items_in": self.items_in,
            p + "items_out": self.items_out,
            p + "bytes_in": self.bytes_in,
            p + "max_depth": self.max_depth,
            p + "depth": self.depth[-1][1] if self.depth else 0,
            p + "put_wait_mean_s": self.put_wait.mean_s,
            p + "put_wait_max_s": self.put_wait.max_s,
            p + "get_wait_mean_s": self.get_wait.mean_s,
            p + "get_wait_max_s": self.get_wait.max_s,
        }


class DepthTrace:
    """Depth samples at most every ``min_gap_s``, keeping the latest value of each gap.

    With ``counter`` set, every recorded depth also goes to ``tracer`` (by default the calling
    thread's, see ``get_tracer``) as that counter track (series ``depth``) when it traces: the
    timeline gets each change, not the thinned samples.
    """

    def __init__(self, min_gap_s: float = 0.005, maxlen: int = 20_000, counter: str | None = None,
                 tracer: Tracer | None = None) -> None:
        self.t0 = time.monotonic()
        self.min_gap_s = min_gap_s
        self.counter = counter
        self.tracer = tracer
        self.samples: deque[tuple[float, int]] = deque(maxlen=maxlen)

    def record(self, depth: int) -> None:
        if self.counter is not None:
            tracer = self.tracer or get_tracer()
            if tracer.enabled:
                tracer.counter(self.counter, depth, series="depth")
        now = time.monotonic() - self.t0
        if self.samples and now - self.samples[-1][0] < self.min_gap_s:
            self.samples[-1] = (self.samples[-1][0], depth)
        else:
            self.samples.append((now, depth))
