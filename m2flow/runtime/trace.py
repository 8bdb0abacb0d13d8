"""Timeline tracing: what every worker did when, as one Chrome/Perfetto trace per run.

Each process owns one ``Tracer``. Spans (``with tracer.span("train", cat="train", mb=3):``) and counters
(``tracer.counter("channel/rollout_out", depth)``) are appended to an in-memory list as plain tuples,
with no Ray round trip and no serialisation on the hot path; the list is written as JSON lines to one
shard per process under ``run_dir/trace/`` when it fills, on ``flush()`` and at exit (a shard stops
growing at ``$M2FLOW_TRACE_MAX_MB`` when set). ``merge_traces`` (``trace_merge.py``, in bounded memory)
joins the shards into ``run_dir/trace.json`` (``traceEvents`` with ``X`` spans, ``C`` counters and ``M``
metadata naming each process ``group[rank] @nodeN``), which Perfetto and ``chrome://tracing`` open.

A disabled tracer hands out one shared no-op span, so instrumented code costs a method call when
tracing is off. Times are taken with ``perf_counter_ns`` (monotonic, so spans on one thread nest
exactly) and shifted onto the wall clock once per process, which lines processes up with each other.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from m2flow.runtime.trace_merge import (
    TRACE_FILE,
    TRACE_SUBDIR,
    iter_spans,
    load_trace,
    merge_traces,
    prepare_trace_dir,
    process_row_name,
)

__all__ = [
    "CATEGORIES", "STEP_CATEGORY", "TRACE_FILE", "TRACE_SUBDIR", "WAIT_CATEGORIES", "ProcessInfo", "Tracer",
    "category_of", "configure_tracer", "get_tracer", "iter_spans", "load_trace", "merge_traces",
    "prepare_trace_dir", "set_tracer", "trace_category", "traced",
]

log = logging.getLogger(__name__)

# Categories the runtime and the workflows use; any other string is allowed too.
CATEGORIES = (
    "step", "generate", "reward", "logprobs", "train", "env_step", "weight_sync",
    "offload", "onload", "wait_channel", "wait_lock",
)
# Time in these categories is spent waiting: the device is not busy.
WAIT_CATEGORIES = frozenset({"wait_channel", "wait_lock"})
# The driver marks each iteration with a span of this category; reports slice time by it.
STEP_CATEGORY = "step"
_CATEGORY_ATTR = "_m2flow_trace_category"
MAX_MB_ENV = "M2FLOW_TRACE_MAX_MB"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ProcessInfo:
    """Who a trace shard belongs to; becomes the process row of the merged trace."""

    group: str = "driver"
    rank: int = 0
    node_rank: int = 0
    devices: tuple[int, ...] = ()
    device_type: str = "cpu"

    @property
    def name(self) -> str:
        """The row title: ``group[rank] @nodeN`` (just ``driver @nodeN`` for the driver)."""
        return process_row_name(self.group, self.rank, self.node_rank)


class _NoopSpan:
    """The span a disabled tracer returns: entering and leaving it does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoopSpan:
        return self

    def annotate(self, **args: Any) -> None:
        return None

    # Named parameters, not *exc: packing a tuple costs as much as the rest of the call.
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def set(self, **args: Any) -> None:
        """Add arguments to the span (ignored)."""


_NOOP = _NoopSpan()


class _Span:
    __slots__ = ("_tracer", "_name", "_cat", "_args", "_t0")

    def __init__(self, tracer: Tracer, name: str, cat: str, args: dict[str, Any]) -> None:
        self._tracer = tracer
        self._name = name
        self._cat = cat
        self._args = args

    def __enter__(self) -> _Span:
        self._t0 = time.perf_counter_ns()
        return self

    def annotate(self, **args: Any) -> None:
        """Add arguments known only once the block has run (recorded when it ends)."""
        self._args = {**self._args, **args}

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        t1 = time.perf_counter_ns()
        tracer = self._tracer
        # Tracer._record inlined: this is the hot path of every traced block.
        events = tracer._events
        events.append(
            ("X", self._name, self._cat, self._t0, t1 - self._t0, threading.get_ident(), self._args)
        )
        if len(events) >= tracer.capacity:
            tracer._overflow()

    def set(self, **args: Any) -> None:
        """Add arguments known only once the span has started (e.g. the size of a batch)."""
        self._args.update(args)


class Tracer:
    """Spans and counters of one process, buffered in memory and flushed to a shard file."""

    def __init__(
        self,
        trace_dir: str | Path | None = None,
        info: ProcessInfo | None = None,
        enabled: bool = True,
        capacity: int = 50_000,
        offset_ns: int | None = None,
        max_shard_bytes: int | None = None,
    ) -> None:
        """``offset_ns`` maps ``perf_counter_ns`` onto the wall clock; by default it is measured now.

        ``max_shard_bytes`` caps the shard file (default ``$M2FLOW_TRACE_MAX_MB`` MiB, else no cap):
        once reached, later events are counted and dropped, so a long run's trace stays bounded.
        """
        self.enabled = enabled
        self.info = info or ProcessInfo()
        self.capacity = max(1, capacity)
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self._events: list[tuple] = []
        self._flush_lock = threading.Lock()
        # One offset per process puts monotonic readings on the wall clock all processes share.
        self._offset_ns = time.time_ns() - time.perf_counter_ns() if offset_ns is None else offset_ns
        self._shard: Path | None = None
        self._dropped = 0
        self._written = 0
        if max_shard_bytes is None and os.environ.get(MAX_MB_ENV):
            max_shard_bytes = int(float(os.environ[MAX_MB_ENV]) * (1 << 20))
        self.max_shard_bytes = max_shard_bytes
        if enabled and self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.info.group)
            self._shard = self.trace_dir / f"{safe}.{self.info.rank}.{os.getpid()}.jsonl"

    # -- recording ---------------------------------------------------------------------------
    def span(self, name: str, cat: str | None = None, **args: Any) -> _Span | _NoopSpan:
        """A context manager timing a block as one span; ``cat`` defaults to ``name``."""
        if not self.enabled:
            return _NOOP
        return _Span(self, name, cat or name, args)

    def complete(self, name: str, start_ns: int, dur_ns: int, cat: str | None = None,
                 **args: Any) -> None:
        """Record a span measured elsewhere, from ``time.perf_counter_ns()`` readings."""
        if self.enabled:
            self._record(("X", name, cat or name, start_ns, dur_ns, threading.get_ident(), args))

    def counter(self, name: str, value: float, series: str = "value", shared: bool = True) -> None:
        """Set counter track ``name`` (series ``series``) to ``value`` from now on.

        Shared counters from every process meet on one "counters" row of the merged trace (a channel
        depth seen by its producer and its consumer); others stay on this process's row.
        """
        if self.enabled:
            self._record(("C", name, series, time.perf_counter_ns(), value, shared))

    def _record(self, event: tuple) -> None:
        events = self._events
        events.append(event)
        if len(events) >= self.capacity:
            self._overflow()

    def _overflow(self) -> None:
        if self._shard is not None:
            self.flush()
            return
        # In memory only: keep the newest half, like a ring buffer.
        n = len(self._events) // 2
        del self._events[:n]
        if not self._dropped:
            log.warning("trace buffer of %d events full with no trace dir; dropping oldest", self.capacity)
        self._dropped += n

    def events(self) -> list[tuple]:
        """The events not yet flushed (in-memory tracers and tests)."""
        return list(self._events)

    # -- output ------------------------------------------------------------------------------
    def flush(self) -> int:
        """Append buffered events to this process's shard; returns how many were written."""
        if self._shard is None:
            return 0
        with self._flush_lock:
            # Slice then delete: appends from other threads in between stay in the buffer.
            n = len(self._events)
            if n == 0:
                return 0
            chunk = self._events[:n]
            del self._events[:n]
            if self.max_shard_bytes is not None and self._written >= self.max_shard_bytes:
                if not self._dropped:
                    log.warning("trace shard %s reached its cap of %d bytes; later events are dropped",
                                self._shard, self.max_shard_bytes)
                self._dropped += n
                return 0
            first = not self._shard.exists()
            lines = []
            if first:
                lines.append(json.dumps({"kind": "process", **asdict(self.info),
                                         "pid": os.getpid(), "host": socket.gethostname()}))
            # A thread that is starting has no ident yet: it is named in a later flush.
            names = {str(t.ident): t.name for t in threading.enumerate() if t.ident is not None}
            lines.append(json.dumps({"kind": "threads", "names": names}))
            off = self._offset_ns
            for ev in chunk:
                if ev[0] == "X":
                    _, name, cat, t0, dur, tid, args = ev
                    rec = {"kind": "X", "name": name, "cat": cat, "ts": t0 + off, "dur": dur,
                           "tid": tid}
                    if args:
                        rec["args"] = args
                else:
                    _, name, series, t, value, shared = ev
                    rec = {"kind": "C", "name": name, "series": series, "ts": t + off,
                           "value": value, "shared": shared}
                lines.append(json.dumps(rec, default=str))
            text = "\n".join(lines) + "\n"
            with open(self._shard, "a", encoding="utf-8") as f:
                f.write(text)
            self._written += len(text)
            return n

    def close(self) -> None:
        """Flush what is left; the tracer records nothing afterwards."""
        self.flush()
        self.enabled = False


_DISABLED = Tracer(enabled=False)
_current: Tracer = _DISABLED


_thread = threading.local()  # .tracer: the calling thread's own tracer (an in-process rank's), if any


def get_tracer() -> Tracer:
    """The calling thread's tracer when it has one (``set_thread_tracer``), else this process's (a
    disabled one unless ``configure_tracer`` or ``set_tracer`` ran)."""
    return getattr(_thread, "tracer", None) or _current


def set_thread_tracer(tracer: Tracer | None) -> None:
    """Give the calling thread a tracer of its own (None: back to the process's). A rank that lives in
    a thread of a shared process (the local executor) traces into its own shard, as a process would."""
    _thread.tracer = tracer


def set_tracer(tracer: Tracer | None) -> Tracer:
    """Install ``tracer`` (None: the disabled one) as this process's tracer; returns the previous."""
    global _current
    previous = _current
    _current = tracer if tracer is not None else _DISABLED
    return previous


def configure_tracer(trace_dir: str | Path, info: ProcessInfo, capacity: int = 50_000) -> Tracer:
    """Create an enabled tracer writing under ``trace_dir``, install it, and flush it at exit."""
    tracer = Tracer(trace_dir, info, enabled=True, capacity=capacity)
    set_tracer(tracer)
    atexit.register(tracer.flush)
    return tracer


def trace_category(cat: str) -> Callable[[F], F]:
    """Mark a worker method's category, used by the span ``WorkerGroup`` records per call."""

    def mark(fn: F) -> F:
        setattr(fn, _CATEGORY_ATTR, cat)
        return fn

    return mark


def category_of(fn: Any, default: str) -> str:
    """The category ``trace_category`` gave ``fn`` (bound methods included), else ``default``."""
    return getattr(fn, _CATEGORY_ATTR, default)


def traced(fn: F | None = None, *, name: str | None = None, cat: str | None = None) -> Any:
    """Decorator: record a span per call of ``fn`` in the tracer current at call time."""

    def wrap(f: F) -> F:
        span_name = name or f.__name__
        span_cat = cat or getattr(f, _CATEGORY_ATTR, span_name)

        @functools.wraps(f)
        def inner(*args: Any, **kwargs: Any) -> Any:
            tracer = _current
            if not tracer.enabled:
                return f(*args, **kwargs)
            with _Span(tracer, span_name, span_cat, {}):
                return f(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap
