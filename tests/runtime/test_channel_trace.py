"""Channel depth as a counter track of the run's trace: from a host in this process and from a host actor."""

from __future__ import annotations

import itertools

import pytest

from m2flow.runtime.channel import Channel
from m2flow.runtime.trace import (
    ProcessInfo,
    Tracer,
    load_trace,
    merge_traces,
    prepare_trace_dir,
    set_tracer,
)
from tests.ray_session import shared_cluster

_names = itertools.count()


def _depths(trace: dict, name: str) -> list[tuple[int, str, float]]:
    """(pid, series, value) of the counter events of ``name``, in time order."""
    events = sorted((e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == name),
                    key=lambda e: e["ts"])
    return [(e["pid"], *next(iter(e["args"].items()))) for e in events]


def _traced_run(tmp_path, local: bool) -> tuple[dict, str]:
    """Driver traces; a channel takes 3 puts, a batch of 2, one get, then closes; returns the merged trace."""
    tracer = Tracer(prepare_trace_dir(tmp_path), ProcessInfo())
    previous = set_tracer(tracer)
    name = f"depth-{next(_names)}"
    ch = Channel.create(name, local=local)
    try:
        with tracer.span("step", cat="step", step=0):
            for i in range(3):
                ch.put(i)
            assert ch.get_batch(2) == [0, 1]
            assert ch.get() == 2
            ch.close()  # flushes the host's depth track before it returns
    finally:
        set_tracer(previous)
        tracer.close()
        ch.disconnect()
        ch.destroy()
    return load_trace(merge_traces(tmp_path)), name


def _counters_pid(trace: dict) -> int:
    return next(e["pid"] for e in trace["traceEvents"]
                if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == "counters")


def test_host_in_this_process_records_depth_on_the_counters_row(tmp_path):
    trace, name = _traced_run(tmp_path, local=True)
    pid = _counters_pid(trace)
    # 1, 2, 3 after the puts; 1 after the batch of two; 0 after the last get.
    assert _depths(trace, f"channel/{name}") == [(pid, "depth", v) for v in (1, 2, 3, 1, 0)]


def test_host_actor_traces_into_the_run_dir_of_its_creator(tmp_path):
    shared_cluster()
    trace, name = _traced_run(tmp_path, local=False)
    shards = sorted(p.name for p in (tmp_path / "trace").glob("*.jsonl"))
    assert len(shards) == 2 and any(s.startswith(f"channel_{name}.0.") for s in shards), shards
    pid = _counters_pid(trace)
    assert _depths(trace, f"channel/{name}") == [(pid, "depth", v) for v in (1, 2, 3, 1, 0)]
    # The host has no spans: its depth sits on the counters row and it gets no row of its own.
    procs = [p["name"] for p in trace["otherData"]["m2flow"]["processes"]]
    assert procs == ["driver @node0"]


def test_channels_sharing_a_host_actor_each_get_their_own_depth_track(tmp_path):
    shared_cluster()
    tracer = Tracer(prepare_trace_dir(tmp_path), ProcessInfo())
    previous = set_tracer(tracer)
    names = [f"depth-{next(_names)}" for _ in range(2)]
    chs = [Channel.create(name) for name in names]
    try:
        assert chs[0].address.actor_name == chs[1].address.actor_name  # one host process for both
        for n, ch in enumerate(chs):
            for i in range(n + 1):
                ch.put(i)
        assert chs[1].get() == 0
        for ch in chs:
            ch.close()
    finally:
        set_tracer(previous)
        tracer.close()
        for ch in chs:
            ch.disconnect()
            ch.destroy()
    trace = load_trace(merge_traces(tmp_path))
    shards = sorted(p.name for p in (tmp_path / "trace").glob("*.jsonl"))
    assert [any(s.startswith(f"channel_{name}.0.") for s in shards) for name in names] == [True, True], shards
    pid = _counters_pid(trace)
    assert _depths(trace, f"channel/{names[0]}") == [(pid, "depth", 1)]
    # 1, 2 after the puts, 1 after the get (then 0 once the get pushed the next item ahead).
    assert _depths(trace, f"channel/{names[1]}")[:3] == [(pid, "depth", v) for v in (1, 2, 1)]
