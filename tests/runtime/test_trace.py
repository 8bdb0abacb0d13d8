"""Tracing: spans and counters recorded per process, shards merged into one Chrome/Perfetto trace."""

from __future__ import annotations

import json
import threading
import tracemalloc

import pytest

from m2flow.runtime import WorkerGroup
from m2flow.runtime.trace import (
    ProcessInfo,
    Tracer,
    category_of,
    get_tracer,
    load_trace,
    merge_traces,
    prepare_trace_dir,
    set_tracer,
    trace_category,
    traced,
)
from m2flow.runtime.worker import Worker

MS = 1_000_000  # ns


def _spans(trace, pid=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)]


def _pid_of(trace, name):
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == name:
            return e["pid"]
    raise AssertionError(f"no process named {name!r}")


def check_nesting(spans: list[dict]) -> None:
    """Spans of one track, in file order: start times never go back, and any two nest or are disjoint."""
    stack: list[float] = []
    last_ts = float("-inf")
    eps = 1e-6  # us: rounding to 3 decimals
    for e in spans:
        assert e["ts"] >= last_ts, f"timestamps go back at {e}"
        last_ts = e["ts"]
        while stack and stack[-1] <= e["ts"] + eps:
            stack.pop()
        end = e["ts"] + e["dur"]
        if stack:
            assert end <= stack[-1] + eps, f"{e} sticks out of its parent ending at {stack[-1]}"
        stack.append(end)


# ----------------------------------------------------------------------------- in one process


def test_span_records_name_category_args_and_nests():
    t = Tracer(None, offset_ns=0)
    with t.span("train", cat="train", mb=3) as outer:
        with t.span("forward"):
            pass
        outer.set(tokens=128)
    inner, outer_ev = t.events()  # the inner span closes first
    assert inner[:3] == ("X", "forward", "forward")
    assert outer_ev[:3] == ("X", "train", "train")
    assert outer_ev[6] == {"mb": 3, "tokens": 128}
    assert outer_ev[3] <= inner[3] and inner[3] + inner[4] <= outer_ev[3] + outer_ev[4]
    assert inner[5] == outer_ev[5] == threading.get_ident()


def test_disabled_tracer_is_a_shared_noop():
    t = Tracer(enabled=False)
    a, b = t.span("x"), t.span("y", cat="train", mb=1)
    assert a is b
    with a as s:
        s.set(anything=1)
    t.counter("channel/q", 3)
    t.complete("z", 0, 10)
    assert t.events() == []
    assert t.flush() == 0


def test_counters_and_complete_spans():
    t = Tracer(None, offset_ns=0)
    t.counter("channel/rollout_out", 4)
    t.counter("device_lock/2", 1, series="actor[0]", shared=True)
    t.complete("wait_lock", 5 * MS, 2 * MS, cat="wait_lock", devices=[2])
    c1, c2, x = t.events()
    assert c1[:3] == ("C", "channel/rollout_out", "value") and c1[4] == 4
    assert c2[1:3] == ("device_lock/2", "actor[0]") and c2[4] == 1
    assert x[:5] == ("X", "wait_lock", "wait_lock", 5 * MS, 2 * MS)
    assert x[6] == {"devices": [2]}


def test_in_memory_tracer_keeps_the_newest_events_like_a_ring():
    t = Tracer(None, capacity=4, offset_ns=0)
    for i in range(10):
        t.complete(f"s{i}", i, 1)
    names = [e[1] for e in t.events()]
    assert names[-1] == "s9" and len(names) <= 4
    assert names == sorted(names, key=lambda n: int(n[1:]))


def test_tracer_with_a_dir_flushes_when_full(tmp_path):
    t = Tracer(tmp_path / "trace", ProcessInfo("actor", 1), capacity=3, offset_ns=0)
    for i in range(7):
        t.complete(f"s{i}", i * MS, MS)
    assert len(t.events()) == 1  # two flushes of three; one event still buffered
    t.close()
    lines = [json.loads(x) for x in next((tmp_path / "trace").glob("actor.1.*.jsonl")).read_text().splitlines()]
    assert lines[0]["kind"] == "process" and lines[0]["group"] == "actor" and lines[0]["rank"] == 1
    assert [x["name"] for x in lines if x["kind"] == "X"] == [f"s{i}" for i in range(7)]
    t.complete("after-close", 0, 1)
    assert t.events() == []


def test_traced_decorator_and_category_marks():
    @trace_category("train")
    def step(x):
        return x + 1

    @traced
    def plain(x):
        return x * 2

    wrapped = traced(step)
    named = traced(name="gen", cat="generate")(lambda: 7)
    assert category_of(step, "step") == "train" and category_of(plain, "plain") == "plain"
    t = Tracer(None, offset_ns=0)
    previous = set_tracer(t)
    try:
        assert wrapped(1) == 2 and plain(3) == 6 and named() == 7
        assert get_tracer() is t
    finally:
        set_tracer(previous)
    assert [(e[1], e[2]) for e in t.events()] == [("step", "train"), ("plain", "plain"),
                                                  ("gen", "generate")]
    assert plain(1) == 2  # the disabled tracer is back: nothing recorded
    assert len(t.events()) == 3


def test_merge_names_processes_orders_tracks_and_rebases_time(tmp_path):
    trace_dir = tmp_path / "trace"
    base = 1_700_000_000 * 10**9
    driver = Tracer(trace_dir, ProcessInfo("driver"), offset_ns=base)
    actor = Tracer(trace_dir, ProcessInfo("actor", 1, node_rank=0, devices=(2, 3)), offset_ns=base)
    rollout = Tracer(trace_dir, ProcessInfo("rollout", 0, node_rank=1, devices=(0,)), offset_ns=base)
    driver.complete("step", 0, 10 * MS, cat="step", step=0)
    rollout.complete("generate", 1 * MS, 3 * MS, cat="generate", mb=0)
    actor.complete("train", 4 * MS, 5 * MS, cat="train")
    actor.complete("wait_lock", 4 * MS, 1 * MS, cat="wait_lock")  # nested, recorded after its parent
    actor.counter("device_lock/2", 1, series="actor[1]")
    actor.counter("local/thing", 5, shared=False)
    for t in (driver, actor, rollout):
        t.close()
    out = merge_traces(tmp_path)
    assert out == tmp_path / "trace.json"
    trace = load_trace(tmp_path)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    # Driver first, then groups by their first event (rollout starts before actor), counters last.
    assert names == {1: "driver @node0", 2: "rollout[0] @node1", 3: "actor[1] @node0", 4: "counters"}
    assert trace["otherData"]["m2flow"]["origin_ns"] == base
    procs = {p["name"]: p for p in trace["otherData"]["m2flow"]["processes"]}
    assert procs["actor[1] @node0"]["devices"] == [2, 3]
    actor_spans = _spans(trace, 3)
    assert [(e["name"], e["ts"], e["dur"]) for e in actor_spans] == [
        ("train", 4000.0, 5000.0), ("wait_lock", 4000.0, 1000.0)]  # enclosing span first
    check_nesting(actor_spans)
    gen = _spans(trace, 2)[0]
    assert (gen["cat"], gen["ts"], gen["dur"], gen["args"]) == ("generate", 1000.0, 3000.0, {"mb": 0})
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {(e["pid"], e["name"], tuple(e["args"].items())) for e in counters} == {
        (4, "device_lock/2", (("actor[1]", 1),)), (3, "local/thing", (("value", 5),))}


def test_merge_gives_a_process_with_only_shared_counters_no_row(tmp_path):
    trace_dir = tmp_path / "trace"
    driver = Tracer(trace_dir, ProcessInfo("driver"), offset_ns=0)
    host = Tracer(trace_dir, ProcessInfo("channel:ready", 0), offset_ns=0)
    driver.complete("step", 0, 10 * MS, cat="step")
    host.counter("channel/ready", 2, series="depth")
    for t in (driver, host):
        t.close()
    trace = load_trace(merge_traces(tmp_path))
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: "driver @node0", 2: "counters"}
    assert [p["name"] for p in trace["otherData"]["m2flow"]["processes"]] == ["driver @node0"]
    (counter,) = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert (counter["pid"], counter["name"], counter["args"]) == (2, "channel/ready", {"depth": 2})


def _merged_spans_after_appending(tmp_path, text: str) -> list[str]:
    """Names of the merged spans of a one-span shard with ``text`` appended to it."""
    t = Tracer(tmp_path / "trace", ProcessInfo("env", 0), offset_ns=0)
    t.complete("env_step", 0, MS, cat="env_step")
    t.close()
    shard = next((tmp_path / "trace").glob("*.jsonl"))
    with open(shard, "a") as f:
        f.write(text)
    return [e["name"] for e in _spans(load_trace(merge_traces(tmp_path)))]


def test_merge_skips_a_torn_last_line_and_needs_shards(tmp_path, caplog):
    assert merge_traces(tmp_path) is None
    assert "no trace shards" in caplog.text
    assert _merged_spans_after_appending(tmp_path, '{"kind": "X", "name": "cut') == ["env_step"]


def test_merge_ignores_a_thread_without_an_ident(tmp_path):
    # Shards written before a starting thread's ident was skipped named it "None".
    text = '{"kind": "threads", "names": {"None": "starting"}}\n'
    assert _merged_spans_after_appending(tmp_path, text) == ["env_step"]


def _one_span_run(tmp_path, name: str) -> None:
    t = Tracer(prepare_trace_dir(tmp_path), ProcessInfo(), offset_ns=0)
    t.complete(name, 0, 1, cat="step")
    t.close()


def test_prepare_trace_dir_sets_an_earlier_run_aside_until_the_next_merge(tmp_path):
    _one_span_run(tmp_path, "first")
    merge_traces(tmp_path)
    prepare_trace_dir(tmp_path)  # a resume starts: nothing of the first run is deleted yet
    assert list((tmp_path / "trace").glob("*.jsonl")) == [] and not (tmp_path / "trace.json").exists()
    (aside,) = (tmp_path / "trace" / "previous").iterdir()
    assert sorted(p.suffix for p in aside.iterdir()) == [".json", ".jsonl"]
    try:  # the resume fails: its merge keeps the earlier trace
        raise RuntimeError("resume failed")
    except RuntimeError:
        merge_traces(tmp_path)
    assert (aside / "trace.json").exists()
    _one_span_run(tmp_path, "second")
    merge_traces(tmp_path)  # this run got to its end: its trace supersedes the earlier ones
    assert not (tmp_path / "trace" / "previous").exists()
    assert [e["name"] for e in _spans(load_trace(tmp_path))] == ["second"]


def test_a_failed_run_without_shards_raises_its_own_error(tmp_path, caplog):
    prepare_trace_dir(tmp_path)
    with pytest.raises(ValueError, match="the run's own error"):
        try:
            raise ValueError("the run's own error")
        finally:
            merge_traces(tmp_path)
    assert "no trace shards" in caplog.text


def test_a_merge_failing_while_the_run_fails_does_not_mask_the_error(tmp_path, caplog, monkeypatch):
    _one_span_run(tmp_path, "step")
    monkeypatch.setattr("m2flow.runtime.trace_merge._summarize", lambda path: 1 / 0)
    with pytest.raises(KeyError, match="real"):
        try:
            raise KeyError("real")
        finally:
            assert merge_traces(tmp_path) is None
    assert "could not merge" in caplog.text
    with pytest.raises(ZeroDivisionError):  # with no error in flight a broken merge still raises
        merge_traces(tmp_path)


def _write_shards(trace_dir, shards: int, events: int) -> None:
    for r in range(shards):
        t = Tracer(trace_dir, ProcessInfo("env", r), offset_ns=0, capacity=10**9)
        for i in range(events):  # out of order on purpose: the merge sorts each track by time
            t.complete("env_step", ((i * 7919) % events) * MS, MS // 2, cat="env_step", i=i, pad="x" * 400)
        t.close()


def _merge_peak(tmp_path, shards: int, events: int) -> tuple[int, dict]:
    trace_dir = tmp_path / f"run{shards}" / "trace"
    _write_shards(trace_dir, shards, events)
    tracemalloc.start()
    try:
        merge_traces(trace_dir.parent, chunk_events=500)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, load_trace(trace_dir.parent)


def test_merge_memory_stays_bounded_however_many_shards(tmp_path):
    events = 2_000
    small, _ = _merge_peak(tmp_path, 2, events)
    big, trace = _merge_peak(tmp_path, 10, events)
    shard_bytes = sum(p.stat().st_size for p in (tmp_path / "run10" / "trace").glob("*.jsonl"))
    # Loading every shard would hold 20k events (> 9 MB as text alone); the merge holds one chunk.
    assert big < shard_bytes / 4 and big < 2 * small + (1 << 20), (small, big, shard_bytes)
    spans = _spans(trace)
    assert len(spans) == 10 * events
    for pid in {e["pid"] for e in spans}:
        ts = [e["ts"] for e in spans if e["pid"] == pid]
        assert ts == sorted(ts) and len(ts) == events


def test_a_shard_stops_growing_at_its_cap(tmp_path):
    t = Tracer(tmp_path / "trace", ProcessInfo(), offset_ns=0, capacity=10, max_shard_bytes=2_000)
    for i in range(500):
        t.complete("step", i, 1, cat="step")
    t.close()
    (shard,) = (tmp_path / "trace").glob("*.jsonl")
    assert shard.stat().st_size < 2_000 + 10 * 200 and t._dropped > 0


# ----------------------------------------------------------------------------- on Ray workers


class Learner(Worker):
    """Takes its device in turn and records a nested micro-batch span."""

    def onload(self) -> None:
        pass

    @trace_category("train")
    def fit(self, mb: int) -> int:
        with self.device_turn(offload_after=True):
            with self.tracer.span("micro_batch", cat="train", mb=mb):
                return mb

    def plain(self) -> bool:
        return self.tracer.enabled


def test_worker_groups_trace_each_call_lock_waits_and_ownership(cluster, tmp_path):
    trace_dir = prepare_trace_dir(tmp_path)
    plan = cluster.placement("a,b: 1", components=["a", "b"])  # collocated on device 1
    a = WorkerGroup(Learner, cluster, "trace_a", placement=plan["a"], trace_dir=trace_dir)
    b = WorkerGroup(Learner, cluster, "trace_b", placement=plan["b"], trace_dir=trace_dir)
    untraced = WorkerGroup(Learner, cluster, "trace_off", num_ranks=1)
    try:
        ha, hb = a.fit(1), b.fit(2)
        assert ha.wait(timeout=60) == [1] and hb.wait(timeout=60) == [2]
        assert a.plain().wait(timeout=60) == b.plain().wait(timeout=60) == [True]
        assert untraced.plain().wait(timeout=60) == [False]
    finally:
        for g in (a, b, untraced):
            g.shutdown()
    trace = load_trace(merge_traces(tmp_path))
    procs = {p["name"]: p["pid"] for p in trace["otherData"]["m2flow"]["processes"]}
    assert set(procs) == {"trace_a[0] @node0", "trace_b[0] @node0"}
    for name, pid in procs.items():
        spans = _spans(trace, pid)
        check_nesting(spans)
        # fit -> wait_lock, onload, micro_batch, offload (nested, in time order); then plain.
        assert [(e["name"], e["cat"]) for e in spans] == [
            ("fit", "train"), ("wait_lock", "wait_lock"), ("onload", "onload"),
            ("micro_batch", "train"), ("offload", "offload"), ("plain", "plain")], name
        mb = spans[3]
        assert mb["args"]["mb"] == (1 if name.startswith("trace_a") else 2)
    # Ownership: the device's lock track has a 1 then a 0 from each of the two groups sharing it.
    owners = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "C" and e["name"].startswith("device_lock/"):
            (series, value), = e["args"].items()
            owners.setdefault((e["name"], series), []).append(value)
    assert sorted(owners) == [("device_lock/1", "trace_a[0]"), ("device_lock/1", "trace_b[0]")]
    assert all(v == [1, 0] for v in owners.values())
