"""Which probes ``m2flow profile`` runs on a CPU machine, and what a call to another process costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.workflows.plan_context import PlanContext
from m2flow.workflows.profiler import Probe, Profiler, dispatch_latency
from m2flow.workflows.registry import load_workflow_config

DEMO = Path(__file__).resolve().parents[2] / "m2flow" / "workflows" / "reasoning_demo.yaml"


def _profiler(tmp_path: Path, *overrides: str) -> Profiler:
    spec, cfg = load_workflow_config(DEMO, [f"run_dir={tmp_path / 'run'}", *overrides])
    profiler = Profiler(PlanContext(spec, cfg), iterations=2, work_dir=tmp_path, say=lambda line: None)
    profiler.cores = 2  # as on a 2-core machine, whatever this one has
    return profiler


def test_a_two_thread_config_is_also_probed_on_one_thread_and_under_ray(tmp_path):
    probes = _profiler(tmp_path, "cluster.cpu_devices_per_node=8").probes()
    by_label = {p.label: p for p in probes}
    assert [p.label for p in probes] == ["b0", "b1", "b2", "t1", "r1"]  # 2 ranks x 2 threads exceed 2 cores
    one = by_label["t1"].overrides
    assert one["actor.num_threads"] == one["rollout.num_threads"] == 1 and one["data.prompts_per_step"] == 32
    assert by_label["t1"].placement == "local" and by_label["t1"].kind == "cost"
    ray = by_label["r1"]
    assert ray.kind == "dispatch" and ray.placement.endswith(": 0") and ray.placement != "local"
    # One device: every plan runs in the driver, no Ray probe; one thread configured: no thread probe.
    alone = _profiler(tmp_path, "cluster.cpu_devices_per_node=1", "actor.num_threads=1").probes()
    assert [p.label for p in alone] == ["b0", "b1", "b2"]


def test_the_dispatch_latency_is_the_extra_time_per_call_of_the_ray_probe():
    local = Probe("b2", {"data.prompts_per_step": 32, "checkpoint_every": 2}, "local", 1, iteration_s=0.15, calls=3)
    other = Probe("b1", {"data.prompts_per_step": 16}, "local", 1, iteration_s=0.05, calls=3)
    ray = Probe("r1", {"data.prompts_per_step": 32}, "a,b: 0", 1, kind="dispatch", iteration_s=0.21, calls=3)
    assert dispatch_latency([other, local, ray]) == pytest.approx(0.02)
    assert dispatch_latency([other, local]) is None
    faster = Probe("r1", {"data.prompts_per_step": 32}, "a,b: 0", 1, kind="dispatch", iteration_s=0.1, calls=3)
    assert dispatch_latency([local, faster]) == 1e-4  # noise: never below the floor
