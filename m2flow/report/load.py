"""Reading a run directory back: the merged trace (merged on the fly from shards) and metrics.jsonl."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m2flow.runtime.trace import STEP_CATEGORY, TRACE_FILE, TRACE_SUBDIR, load_trace, merge_traces

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Span:
    """One ``X`` event, in seconds from the trace origin."""

    start: float
    end: float
    name: str
    cat: str
    args: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class Track:
    """One thread of one process: its spans in start order (enclosing spans first at equal starts)."""

    pid: int
    tid: int
    process: dict[str, Any]
    spans: list[Span]

    @property
    def label(self) -> str:
        """``group[rank]`` (plus the thread when a process has several)."""
        name = self.process["name"].split(" @")[0]
        return name if self.tid == 1 else f"{name}/t{self.tid}"

    @property
    def is_driver(self) -> bool:
        return self.process["group"] == "driver"


@dataclass
class Counter:
    """One counter series: ``(seconds, value)`` points in time order."""

    name: str
    series: str
    points: list[tuple[float, float]]


@dataclass
class RunData:
    """Everything a report reads from one run directory."""

    run_dir: Path
    tracks: list[Track]
    counters: list[Counter]
    metrics: list[dict[str, Any]]

    @property
    def step_spans(self) -> list[Span]:
        """The driver's iteration markers, in time order."""
        return sorted((s for t in self.tracks if t.is_driver for s in t.spans
                       if s.cat == STEP_CATEGORY), key=lambda s: s.start)

    @property
    def worker_tracks(self) -> list[Track]:
        return [t for t in self.tracks if not t.is_driver]


def _tracks(trace: dict[str, Any]) -> tuple[list[Track], list[Counter]]:
    processes = {p["pid"]: p for p in trace.get("otherData", {}).get("m2flow", {}).get("processes", [])}
    names: dict[int, str] = {}
    spans: dict[tuple[int, int], list[Span]] = {}
    counters: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in trace["traceEvents"]:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif ph == "X":
            start = e["ts"] / 1e6
            spans.setdefault((e["pid"], e["tid"]), []).append(
                Span(start, start + e["dur"] / 1e6, e["name"], e.get("cat", e["name"]), e.get("args", {})))
        elif ph == "C":
            for series, value in e.get("args", {}).items():
                counters.setdefault((e["name"], series), []).append((e["ts"] / 1e6, float(value)))
    tracks = []
    for (pid, tid), items in sorted(spans.items()):
        # A trace not written by m2flow has no process table: fall back on the process name.
        proc = processes.get(pid) or {"pid": pid, "name": names.get(pid, f"pid {pid}"),
                                      "group": names.get(pid, f"pid {pid}"), "rank": 0,
                                      "node_rank": 0, "devices": []}
        items.sort(key=lambda s: (s.start, -s.dur))
        tracks.append(Track(pid, tid, proc, items))
    out_counters = [Counter(n, s, sorted(p)) for (n, s), p in sorted(counters.items())]
    return tracks, out_counters


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl file (empty when it does not exist); torn lines are skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("skipping a torn line in %s", path)
    return rows


def load_run(run_dir: str | Path) -> RunData:
    """Read ``run_dir``; merges ``trace/`` shards into ``trace.json`` first when that is missing or stale."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory {run_dir}")
    trace_path = run_dir / TRACE_FILE
    shards = list((run_dir / TRACE_SUBDIR).glob("*.jsonl"))
    if shards and (not trace_path.exists()
                   or max(p.stat().st_mtime for p in shards) > trace_path.stat().st_mtime):
        merge_traces(run_dir)
    tracks: list[Track] = []
    counters: list[Counter] = []
    if trace_path.exists():
        tracks, counters = _tracks(load_trace(trace_path))
    metrics = read_metrics(run_dir / METRICS_FILE)
    if not tracks and not metrics:
        raise FileNotFoundError(f"{run_dir} holds neither {TRACE_FILE} nor {METRICS_FILE}")
    return RunData(run_dir, tracks, counters, metrics)
