"""Where the time went: per-component breakdown of each iteration, device busy/idle, pipeline bubbles.

Attribution rule (so the components of an iteration add up to its measured time): each instant of a
driver ``step`` span goes to exactly one component. At every instant each worker thread is in its
innermost open span; among the categories active somewhere, the instant goes to the one with the
highest priority, where priority is total busy time over the analysed steps (the busiest component
first) and waiting (``wait_lock``, ``wait_channel``) comes after all work. Instants where no worker is
in any span are ``idle``. Per-component busy time (summed over ranks) is reported beside it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from m2flow.report.load import RunData, Span, Track
from m2flow.runtime.trace import STEP_CATEGORY, WAIT_CATEGORIES

IDLE = "idle"


@dataclass(frozen=True)
class Segment:
    """An interval (seconds) in which a thread's innermost open span has category ``cat``."""

    start: float
    end: float
    cat: str


def innermost_segments(spans: Sequence[Span]) -> list[Segment]:
    """Cut a thread's nested spans into disjoint segments labelled by the innermost open span.

    ``spans`` must be in start order with enclosing spans first at equal starts; a span that sticks
    out of its parent is clipped to it.
    """
    out: list[Segment] = []
    stack: list[tuple[float, str]] = []  # (end, cat) of open spans, innermost last
    cursor = 0.0

    def emit(a: float, b: float, cat: str) -> None:
        if b > a:
            out.append(Segment(a, b, cat))

    for s in spans:
        while stack and stack[-1][0] <= s.start:
            end, cat = stack.pop()
            emit(cursor, end, cat)
            cursor = max(cursor, end)
        if stack:
            emit(cursor, s.start, stack[-1][1])
        end = min(s.end, stack[-1][0]) if stack else s.end
        stack.append((end, s.cat))
        cursor = s.start
    while stack:
        end, cat = stack.pop()
        emit(cursor, end, cat)
        cursor = max(cursor, end)
    return out


def clip(segments: Iterable[Segment], start: float, end: float) -> list[Segment]:
    """The parts of ``segments`` inside ``[start, end]``."""
    return [Segment(max(s.start, start), min(s.end, end), s.cat)
            for s in segments if s.end > start and s.start < end]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def gaps(intervals: Iterable[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The uncovered parts of ``[start, end]``."""
    out, cursor = [], start
    for a, b in sorted(intervals):
        if a > cursor:
            out.append((cursor, min(a, end)))
        cursor = max(cursor, b)
        if cursor >= end:
            break
    if cursor < end:
        out.append((cursor, end))
    return [(a, b) for a, b in out if b > a]


@dataclass
class StepBreakdown:
    """One iteration: its measured time and that time split over components (plus idle)."""

    index: int
    start: float
    end: float
    parts: dict[str, float]

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class DeviceUsage:
    """Busy/idle time of one device over the analysed window, and its idle gaps (bubbles)."""

    node_rank: int
    device: int
    processes: list[str]
    busy: float
    window: float
    bubbles: list[tuple[float, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"node{self.node_rank}/dev{self.device}"

    @property
    def busy_fraction(self) -> float:
        return self.busy / self.window if self.window > 0 else 0.0

    @property
    def bubble_time(self) -> float:
        return sum(b - a for a, b in self.bubbles)


@dataclass
class Analysis:
    """The numbers of a report."""

    steps: list[StepBreakdown]
    priority: list[str]
    busy_by_component: dict[str, float]  # rank-seconds inside the analysed steps
    devices: list[DeviceUsage]
    bubble_threshold: float
    segments: dict[tuple[int, int], list[Segment]]  # per (pid, tid), whole run

    @property
    def total_time(self) -> float:
        return sum(s.duration for s in self.steps)

    def totals(self) -> dict[str, float]:
        """Attributed wall time per component over all analysed steps, idle last."""
        out: dict[str, float] = defaultdict(float)
        for s in self.steps:
            for k, v in s.parts.items():
                out[k] += v
        order = [c for c in self.priority if c in out] + ([IDLE] if IDLE in out else [])
        return {k: out[k] for k in order}


def component_priority(busy: dict[str, float]) -> list[str]:
    """Busiest component first; waits after all work (see the module docstring)."""
    return sorted(busy, key=lambda c: (c in WAIT_CATEGORIES, -busy[c], c))


def attribute(segments: Iterable[Segment], start: float, end: float, priority: Sequence[str]
              ) -> dict[str, float]:
    """Split ``[start, end]`` over categories: each instant to the top-priority active one, else idle."""
    rank = {c: i for i, c in enumerate(priority)}
    events: list[tuple[float, int, str]] = []
    for s in clip(segments, start, end):
        events.append((s.start, 1, s.cat))
        events.append((s.end, -1, s.cat))
    events.sort(key=lambda e: e[0])
    active: dict[str, int] = defaultdict(int)
    parts: dict[str, float] = defaultdict(float)
    cursor = start
    i = 0
    while i < len(events):
        t = events[i][0]
        if t > cursor:
            live = [c for c, n in active.items() if n > 0]
            owner = min(live, key=lambda c: rank.get(c, len(rank))) if live else IDLE
            parts[owner] += t - cursor
            cursor = t
        while i < len(events) and events[i][0] == t:
            active[events[i][2]] += events[i][1]
            i += 1
    if end > cursor:
        parts[IDLE] += end - cursor
    return dict(parts)


def _step_windows(run: RunData, skip: int) -> list[Span]:
    steps = run.step_spans
    if not steps:  # no iteration markers: the whole traced extent is one window
        all_spans = [s for t in run.tracks for s in t.spans]
        if not all_spans:
            return []
        return [Span(min(s.start for s in all_spans), max(s.end for s in all_spans), "trace", STEP_CATEGORY)]
    return steps[skip:] if skip < len(steps) else steps[-1:]


def analyse(run: RunData, skip: int = 0, bubble_threshold: float | None = None) -> Analysis:
    """Break the run down: per-step attribution, device usage and bubbles (steps after the first ``skip``)."""
    segments = {(t.pid, t.tid): innermost_segments(t.spans) for t in run.tracks}
    # The driver's own step marker is the frame, not work.
    work = [s for segs in segments.values() for s in segs if s.cat != STEP_CATEGORY]
    windows = _step_windows(run, skip)
    busy: dict[str, float] = defaultdict(float)
    for w in windows:
        for s in clip(work, w.start, w.end):
            busy[s.cat] += s.end - s.start
    priority = component_priority(dict(busy))
    steps = [StepBreakdown(i, w.start, w.end, attribute(work, w.start, w.end, priority))
             for i, w in enumerate(windows, start=max(0, len(run.step_spans) - len(windows)))]
    if bubble_threshold is None:
        # Gaps shorter than 1% of a typical iteration are scheduling noise, not bubbles.
        typical = statistics.median([w.end - w.start for w in windows]) if windows else 0.0
        bubble_threshold = max(1e-4, 0.01 * typical)
    devices = _device_usage(run, segments, windows, bubble_threshold)
    return Analysis(steps, priority, dict(busy), devices, bubble_threshold, segments)


def _device_usage(run: RunData, segments: dict[tuple[int, int], list[Segment]],
                  windows: list[Span], threshold: float) -> list[DeviceUsage]:
    by_device: dict[tuple[int, int], list[Track]] = defaultdict(list)
    for t in run.worker_tracks:
        for d in t.process.get("devices", []):
            by_device[(t.process.get("node_rank", 0), d)].append(t)
    out = []
    for (node, dev), tracks in sorted(by_device.items()):
        busy_iv = [(s.start, s.end) for t in tracks for s in segments[(t.pid, t.tid)]
                   if s.cat not in WAIT_CATEGORIES]
        busy = window = 0.0
        bubbles: list[tuple[float, float]] = []
        for w in windows:
            inside = [(max(a, w.start), min(b, w.end)) for a, b in busy_iv if b > w.start and a < w.end]
            busy += union_length(inside)
            window += w.end - w.start
            bubbles += [g for g in gaps(inside, w.start, w.end) if g[1] - g[0] >= threshold]
        names = sorted({t.label for t in tracks})
        out.append(DeviceUsage(node, dev, names, busy, window, bubbles))
    return out


def step_throughput(analysis: Analysis) -> list[tuple[float, float]]:
    """``(seconds since the first analysed step, iterations per second)`` for each step."""
    if not analysis.steps:
        return []
    t0 = analysis.steps[0].start
    return [(s.end - t0, 1.0 / s.duration if s.duration > 0 else 0.0) for s in analysis.steps]
