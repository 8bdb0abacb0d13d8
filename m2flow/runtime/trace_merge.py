"""Joining a run's trace shards into one Chrome/Perfetto ``trace.json``, in bounded memory.

``merge_traces`` reads each shard twice as a stream: once for the process, its threads and its
earliest timestamp, once for the events, which go through an external sort (sorted runs of
``chunk_events`` spilled to temporary files, then a k-way merge written straight to the output).
However long the run, the merging process holds at most one chunk of events.

A run's trace is never lost to the next attempt in the same directory: ``prepare_trace_dir`` moves
the shards and merged trace of an earlier run aside (``trace/previous/``) instead of deleting them,
and only a merge that completes with no exception in flight (the new run got to its end) removes
them. A merge that finds no shards, or fails while the run's own error is propagating, logs a
warning and returns None, so that error stays the one the caller sees.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

TRACE_SUBDIR = "trace"
TRACE_FILE = "trace.json"
PREVIOUS_SUBDIR = "previous"  # under TRACE_SUBDIR: what an earlier run in this directory left
CHUNK_EVENTS = 200_000  # events sorted in memory at once (about 100 MB of Python objects at most)


def process_row_name(group: str, rank: int, node_rank: int) -> str:
    """The row title: ``group[rank] @nodeN`` (just ``driver @nodeN`` for the driver)."""
    who = group if group == "driver" else f"{group}[{rank}]"
    return f"{who} @node{node_rank}"


def prepare_trace_dir(run_dir: str | Path) -> Path:
    """Create ``run_dir/trace/`` for a new traced run, moving an earlier run's trace aside; returns it.

    Shards of an earlier run in the same directory would otherwise be merged into this run's trace;
    they (and its ``trace.json``) go to ``trace/previous/<time>/`` until this run's merge succeeds.
    """
    run_dir = Path(run_dir)
    trace_dir = run_dir / TRACE_SUBDIR
    trace_dir.mkdir(parents=True, exist_ok=True)
    old = sorted(trace_dir.glob("*.jsonl")) + [p for p in [run_dir / TRACE_FILE] if p.exists()]
    if old:
        aside = trace_dir / PREVIOUS_SUBDIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        aside.mkdir(parents=True, exist_ok=True)
        for path in old:
            path.replace(aside / path.name)
        log.info("moved the earlier trace of %s aside to %s until this run's trace is merged", run_dir, aside)
    return trace_dir


@dataclass
class _Summary:
    """What the first pass learns of one shard; its events are read again in the second."""

    path: Path
    info: dict[str, Any]
    threads: dict[int, str] = field(default_factory=dict)
    first_ts: int | None = None
    owner: bool = False  # has a row of its own: spans or per-process counters
    tids: dict[int, int] = field(default_factory=dict)  # thread ident -> row tid, by first span
    events: int = 0


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a process killed mid-write leaves a torn last line
                log.warning("skipping a torn line in %s", path)


def _summarize(path: Path) -> _Summary | None:
    shard: _Summary | None = None
    for rec in _records(path):
        kind = rec.get("kind")
        if kind == "process":
            shard = _Summary(path, rec)
        elif shard is None:
            log.warning("%s does not start with a process record; skipped", path)
            return None
        elif kind == "threads":
            shard.threads.update({int(k): v for k, v in rec["names"].items() if k.isdigit()})
        else:
            shard.events += 1
            ts = rec["ts"]
            shard.first_ts = ts if shard.first_ts is None else min(shard.first_ts, ts)
            if kind == "X":
                shard.owner = True
                shard.tids.setdefault(rec["tid"], len(shard.tids) + 1)
            elif not rec.get("shared", True):
                shard.owner = True
    return shard


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _event(rec: dict[str, Any], pid: int, tid: int, origin: int) -> dict[str, Any]:
    if rec["kind"] == "X":
        ev = {"ph": "X", "name": rec["name"], "cat": rec["cat"], "pid": pid, "tid": tid,
              "ts": _us(rec["ts"] - origin), "dur": _us(rec["dur"])}
        if rec.get("args"):
            ev["args"] = rec["args"]
        return ev
    return {"ph": "C", "name": rec["name"], "pid": pid, "tid": 0, "ts": _us(rec["ts"] - origin),
            "args": {rec["series"]: rec["value"]}}


class _ExternalSort:
    """Lines sorted by (pid, tid, ts, -dur), spilled in sorted runs; at equal keys, insertion order."""

    def __init__(self, directory: Path, chunk_events: int) -> None:
        self._dir = directory
        self._chunk = max(1, chunk_events)
        self._buffer: list[tuple[tuple, str]] = []
        self._runs: list[Path] = []

    def add(self, ev: dict[str, Any]) -> None:
        self._buffer.append(((ev["pid"], ev["tid"], ev["ts"], -ev.get("dur", 0.0)), json.dumps(ev)))
        if len(self._buffer) >= self._chunk:
            self._spill()

    def _spill(self) -> None:
        self._buffer.sort(key=lambda item: item[0])
        path = self._dir / f"run{len(self._runs)}.txt"
        with open(path, "w", encoding="utf-8") as f:
            for (pid, tid, ts, neg_dur), text in self._buffer:
                f.write(f"{pid}\t{tid}\t{ts!r}\t{neg_dur!r}\t{text}\n")
        self._runs.append(path)
        self._buffer = []

    @staticmethod
    def _read(path: Path) -> Iterator[tuple[tuple, str]]:
        with open(path, encoding="utf-8") as f:
            for line in f:
                pid, tid, ts, neg_dur, text = line.rstrip("\n").split("\t", 4)
                yield (int(pid), int(tid), float(ts), float(neg_dur)), text

    def sorted_lines(self) -> Iterator[str]:
        if not self._runs:  # everything fitted in one chunk
            self._buffer.sort(key=lambda item: item[0])
            for _, text in self._buffer:
                yield text
            return
        if self._buffer:
            self._spill()
        # heapq.merge breaks ties by run order, and runs are in insertion order: a stable sort.
        for _, text in heapq.merge(*(self._read(p) for p in self._runs), key=lambda item: item[0]):
            yield text


def _write_array(f: IO[str], items: Iterable[str], first: bool) -> bool:
    for text in items:
        f.write(text if first else "," + text)
        first = False
    return first


def merge_traces(run_dir: str | Path, out: str | Path | None = None, *,
                 chunk_events: int = CHUNK_EVENTS) -> Path | None:
    """Merge ``run_dir/trace/*.jsonl`` into one Chrome/Perfetto JSON trace (``run_dir/trace.json``).

    Processes are ordered driver first, then groups by their first event, then rank; a process with
    only shared counters (a channel host) gets no row of its own. Timestamps are microseconds from
    the earliest event; the absolute origin is kept in ``otherData``. Returns the merged file, or
    None when there was nothing to merge or the merge failed while another exception propagates.
    """
    failing = sys.exc_info()[1] is not None  # called from a finally block of a failed run
    try:
        return _merge(Path(run_dir), out, chunk_events, failing)
    except Exception as exc:
        if not failing:
            raise
        log.warning("could not merge the trace of %s (%r); the run's own error follows", run_dir, exc)
        return None


def _merge(run_dir: Path, out: str | Path | None, chunk_events: int, failing: bool) -> Path | None:
    out_path = Path(out) if out is not None else run_dir / TRACE_FILE
    shards = [s for p in sorted((run_dir / TRACE_SUBDIR).glob("*.jsonl")) if (s := _summarize(p))]
    if not shards:
        log.warning("no trace shards under %s: nothing to merge", run_dir / TRACE_SUBDIR)
        return None
    starts = [s.first_ts for s in shards if s.first_ts is not None]
    origin = min(starts) if starts else 0
    group_start: dict[str, int] = {}
    for s in shards:
        first = s.first_ts if s.first_ts is not None else origin
        g = s.info["group"]
        group_start[g] = min(group_start.get(g, first), first)
    shards.sort(key=lambda s: (s.info["group"] != "driver", group_start[s.info["group"]],
                               s.info["group"], s.info["rank"], s.info["pid"]))
    owners = [s for s in shards if s.owner]
    pids = {id(s): index + 1 for index, s in enumerate(owners)}
    counters_pid = len(owners) + 1
    meta: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    for s in owners:
        pid, info = pids[id(s)], s.info
        name = process_row_name(info["group"], info["rank"], info["node_rank"])
        devices = list(info.get("devices", []))
        processes.append({"pid": pid, "name": name, "group": info["group"], "rank": info["rank"],
                          "node_rank": info["node_rank"], "devices": devices,
                          "device_type": info.get("device_type", "cpu"), "os_pid": info["pid"],
                          "host": info.get("host", "")})
        label = f"{info.get('device_type', 'cpu')} {devices}" if devices else "no devices"
        meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
                 {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
                 {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}}]
        for ident, tid in s.tids.items():
            tname = s.threads.get(ident, f"thread {tid}")
            meta += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                      "args": {"name": "main" if tname == "MainThread" else tname}},
                     {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out_path.with_suffix(out_path.suffix + ".tmp")
    events = 0
    has_shared = False
    with tempfile.TemporaryDirectory(prefix=".trace-merge-", dir=out_path.parent) as scratch:
        sorter = _ExternalSort(Path(scratch), chunk_events)
        for s in shards:
            own = pids.get(id(s))
            for rec in _records(s.path):
                kind = rec.get("kind")
                if kind not in ("X", "C"):
                    continue
                if kind == "X":
                    if own is None:
                        continue  # cannot happen: a shard with spans owns a row
                    ev = _event(rec, own, s.tids[rec["tid"]], origin)
                else:
                    shared = own is None or rec.get("shared", True)
                    has_shared = has_shared or shared
                    ev = _event(rec, counters_pid if shared else own, 0, origin)
                sorter.add(ev)
                events += 1
        if has_shared:
            meta += [{"ph": "M", "name": "process_name", "pid": counters_pid, "tid": 0, "args": {"name": "counters"}},
                     {"ph": "M", "name": "process_sort_index", "pid": counters_pid, "tid": 0,
                      "args": {"sort_index": counters_pid}}]
        with open(tmp_out, "w", encoding="utf-8") as f:
            f.write('{"traceEvents": [')
            first = _write_array(f, (json.dumps(m) for m in meta), True)
            _write_array(f, sorter.sorted_lines(), first)
            other = {"m2flow": {"origin_ns": origin, "processes": processes}}
            f.write(f'], "displayTimeUnit": "ms", "otherData": {json.dumps(other)}}}')
    tmp_out.replace(out_path)
    log.info("merged %d trace shard(s), %d events, into %s", len(shards), events, out_path)
    previous = run_dir / TRACE_SUBDIR / PREVIOUS_SUBDIR
    if previous.is_dir() and not failing:  # this run got to its end: the earlier trace is superseded
        shutil.rmtree(previous, ignore_errors=True)
    return out_path


def load_trace(path: str | Path) -> dict[str, Any]:
    """Read a merged trace back (``trace.json`` or the run dir holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / TRACE_FILE
    return json.loads(path.read_text(encoding="utf-8"))


def iter_spans(trace: dict[str, Any], pids: Iterable[int] | None = None) -> Iterable[dict[str, Any]]:
    """The ``X`` events of a merged trace (of the given processes only, when ``pids`` is given)."""
    wanted = set(pids) if pids is not None else None
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and (wanted is None or e["pid"] in wanted):
            yield e
