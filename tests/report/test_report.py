"""``m2flow report``: a hand-made run dir and a real traced demo run, read back into tables and PNGs."""

from __future__ import annotations

import re

import json

import pytest

from m2flow.cli import main
from m2flow.report.analysis import IDLE
from m2flow.report.report import build_report
from m2flow.runtime.trace import ProcessInfo, Tracer, load_trace
from tests.runtime.test_trace import check_nesting

MS = 1_000_000
PLOTS = ["gantt.png", "breakdown.png", "throughput.png", "devices.png", "learning_curves.png"]


def _assert_pngs_open(run_dir, names):
    from matplotlib.image import imread

    for name in names:
        img = imread(run_dir / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name


def _hand_made_run(run_dir):
    """Two steps of 10 ms: rollout generates 0-6 ms, actor trains 5-9 ms (a lock wait at 4-5 ms)."""
    trace_dir = run_dir / "trace"
    driver = Tracer(trace_dir, ProcessInfo("driver"), offset_ns=0)
    rollout = Tracer(trace_dir, ProcessInfo("rollout", 0, devices=(0,)), offset_ns=0)
    actor = Tracer(trace_dir, ProcessInfo("actor", 0, devices=(1,)), offset_ns=0)
    for step in range(2):
        t = step * 10 * MS
        driver.complete("step", t, 10 * MS, cat="step", step=step)
        rollout.complete("generate", t, 6 * MS, cat="generate", mb=step)
        actor.complete("train", t + 4 * MS, 5 * MS, cat="train")
        actor.complete("wait_lock", t + 4 * MS, 1 * MS, cat="wait_lock")
    for tr in (driver, rollout, actor):
        tr.close()
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(2):
            f.write(json.dumps({"step": step, "time": 0.0, "time/step": 0.0101,
                                "reward/mean": 0.5 * step, "perf/samples_per_s": 100.0}) + "\n")


def test_report_of_a_hand_made_run(tmp_path, capsys):
    _hand_made_run(tmp_path)
    report = build_report(tmp_path)  # merges the shards first
    assert (tmp_path / "trace.json").exists()
    s = json.loads((tmp_path / "report.json").read_text())
    assert s["iterations"] == 2
    assert s["iteration_time_s"] == pytest.approx(0.020)
    assert {c["name"]: round(c["wall_s"] * 1e3, 6) for c in s["components"]} == {
        "generate": 12.0, "train": 6.0, IDLE: 2.0}
    assert s["measured_step_time_s"] == pytest.approx(0.0202)
    devices = {d["device"]: d for d in s["devices"]}
    assert devices["node0/dev0"]["busy_fraction"] == pytest.approx(0.6)
    assert devices["node0/dev1"]["bubbles"] == 4
    assert sorted(s["plots"]) == sorted(PLOTS)
    _assert_pngs_open(tmp_path, PLOTS)
    assert report.analysis.steps[1].parts == pytest.approx({"generate": 0.006, "train": 0.003, IDLE: 0.001})
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "generate" in out and "node0/dev1" in out and "time/step" in out


def test_report_of_metrics_alone_and_of_nothing(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i, "env/return": float(i), "time/step": 1.0}) + "\n" for i in range(3)))
    report = build_report(tmp_path)
    assert [p.name for p in report.plots] == ["throughput.png", "learning_curves.png"]
    assert main(["report", str(tmp_path / "missing")]) == 1
    assert "no run directory" in capsys.readouterr().err


def test_traced_demo_run_gives_a_valid_trace_and_a_consistent_report(cluster, tmp_path, capsys):
    from m2flow.workflows.runtime_demo.workflow import RuntimeDemoConfig, run_runtime_demo_config

    run_dir = tmp_path / "runtime_demo"
    assert run_runtime_demo_config(RuntimeDemoConfig(steps=4, batch_size=256, run_dir=str(run_dir))) == 0
    trace = load_trace(run_dir)
    # Group names carry the run's id (``producer-1a2b3c4d``); the checks below read them without it.
    procs = {re.sub(r"-[0-9a-f]{8}\[", "[", p["name"]): p["pid"] for p in trace["otherData"]["m2flow"]["processes"]}
    workers = {f"{g}[{r}] @node0": m for g, m in (("producer", "make"), ("scaler", "scale"),
                                                  ("reducer", "add")) for r in (0, 1)}
    assert set(procs) == {"driver @node0", *workers}
    tracks: dict[tuple[int, int], list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for spans in tracks.values():
        check_nesting(spans)
    for name, method in workers.items():
        calls = [e for (pid, _), spans in tracks.items() if pid == procs[name] for e in spans
                 if e["name"] == method]
        assert len(calls) == 4, name  # one call per step on every rank
    steps = [e for e in tracks[(procs["driver @node0"], 1)] if e["cat"] == "step"]
    assert [e["args"]["iteration"] for e in steps] == [0, 1, 2, 3]
    assert [e["args"]["step"] for e in steps] == [1, 2, 3, 4]  # the step each iteration's metrics row has
    # scaler and reducer share devices 2-3: their lock waits and ownership are on the timeline.
    assert any(e["ph"] == "C" and e["name"] == "device_lock/2" for e in trace["traceEvents"])
    assert any(e["name"] == "wait_lock" for e in trace["traceEvents"] if e["ph"] == "X")

    report = build_report(run_dir, last=2)
    for step in report.analysis.steps:
        assert sum(step.parts.values()) == pytest.approx(step.duration, rel=1e-9)
    parts = sum(report.analysis.totals().values())
    assert report.measured_step_time is not None
    assert abs(parts - report.measured_step_time) <= 0.05 * report.measured_step_time
    assert {"make", "scale", "add"} <= set(report.analysis.totals())
    _assert_pngs_open(run_dir, PLOTS)
    capsys.readouterr()
    assert main(["report", str(run_dir), "--no-plots"]) == 0
    assert "producer" in capsys.readouterr().out
