"""Which probes ``m2flow profile`` runs on a CPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.autoplan.plan_context import PlanContext
from m2flow.autoplan.probes import Profiler
from m2flow.driver.registry import load_workflow_config

DEMO = Path(__file__).resolve().parents[2] / "m2flow" / "workflows" / "reasoning/demo.yaml"


def _profiler(tmp_path: Path, *overrides: str) -> Profiler:
    spec, cfg = load_workflow_config(DEMO, [f"run_dir={tmp_path / 'run'}", *overrides])
    profiler = Profiler(PlanContext(spec, cfg), iterations=2, work_dir=tmp_path, say=lambda line: None)
    profiler.cores = 2  # as on a 2-core machine, whatever this one has
    return profiler


def test_a_two_thread_config_is_also_probed_on_one_thread_and_under_ray(tmp_path):
    probes = _profiler(tmp_path, "cluster.cpu_devices_per_node=8").probes()
    by_label = {p.label: p for p in probes}
    # 2 ranks x 2 threads exceed 2 cores: 2 ranks are probed at 1 thread each, and once at their 2 threads
    # (how much worse than sharing the cores that is); 4 ranks not at all.
    assert [p.label for p in probes] == ["b0", "b1", "b2", "t1", "u1", "d2", "o2", "r1", "m1"]
    over = by_label["o2"]
    assert over.kind == "oversubscribed" and over.ranks == 2 and "actor.num_threads" not in over.overrides
    two = by_label["d2"]
    assert two.ranks == 2 and two.overrides["actor.num_threads"] == two.overrides["rollout.num_threads"] == 1
    one = by_label["t1"].overrides
    assert one["actor.num_threads"] == one["rollout.num_threads"] == 1 and one["data.prompts_per_step"] == 32
    assert by_label["t1"].placement == "local" and by_label["t1"].kind == "cost"
    ray = by_label["r1"]
    assert ray.kind == "dispatch" and ray.placement.endswith(": 0") and ray.placement != "local"
    # The message probes: the largest batch with nothing fused, in the driver and in Ray processes.
    for label, kind, placement in (("u1", "local", "local"), ("m1", "remote", ray.placement)):
        p = by_label[label]
        assert p.kind == kind and p.placement == placement
        assert p.overrides["data.prompts_per_step"] == 32
        assert p.overrides["rollout.fuse_with_actor"] is False and p.overrides["reward.fuse_with_rollout"] is False
    # One device: every plan runs in the driver, no Ray probe; one thread configured: no thread probe.
    alone = _profiler(tmp_path, "cluster.cpu_devices_per_node=1", "actor.num_threads=1").probes()
    assert [p.label for p in alone] == ["b0", "b1", "b2", "u1"]


def test_the_cpu_share_is_the_median_over_the_probes_of_cpu_over_busy_seconds():
    from m2flow.autoplan.probes import Probe, cpu_share

    probes = [Probe("b0", {}, "local", 1, busy={"env": 1.0, "actor": 0.5}, cpu={"env": 0.1}),
              Probe("b1", {}, "local", 1, busy={"env": 2.0, "actor": 0.5}, cpu={"env": 0.4}),
              Probe("d2", {}, "env: 0-1", 2, busy={"env": 0.5, "actor": 0.5}, cpu={"env": 0.9})]
    assert cpu_share("env", probes) == pytest.approx(0.2)  # 0.1, 0.2 and 1.8 (counted as 1): the median
    assert cpu_share("actor", probes) is None  # no metric: the profile leaves it out (the cost model takes 1)


PARTIAL = ["rollout.partial=true", "rollout.backend=lean", "rollout.fuse_with_actor=false", "algorithm.max_staleness=1",
           "algorithm.old_logprobs=rollout", "data.prompts_per_step=4", "model.tiny.hidden_size=32",
           "model.tiny.num_layers=1", "model.tiny.intermediate_size=64", "actor.num_threads=1",
           "cluster.cpu_devices_per_node=1"]
"""A tiny demo config with partial rollouts (one device, one thread: the batch-size probes and one unfused)."""


def test_a_profile_without_partial_rollouts_is_not_one_of_a_config_with_them(tmp_path):
    # The hash a profile carries holds rollout.partial: a config with partial rollouts is priced only by a profile
    # whose probes ran them (planner/partial.py: generation is priced as measured, not by a length model).
    from m2flow.autoplan.plan_context import PlanContext

    spec, cfg = load_workflow_config(DEMO, [f"run_dir={tmp_path / 'run'}", *PARTIAL])
    spec, without = load_workflow_config(DEMO, [f"run_dir={tmp_path / 'run'}", *PARTIAL, "rollout.partial=false"])
    assert PlanContext(spec, cfg).config_hash() != PlanContext(spec, without).config_hash()


@pytest.mark.slow
def test_a_partial_rollout_config_is_profiled_with_partial_rollouts(tmp_path):
    # The rollout's curve of a config with partial rollouts is fitted on iterations that stop at the groups that
    # finish first and carry the rest, measured by the probes (about 10 CPU-seconds: slow).
    import json

    profiler = _profiler(tmp_path, *PARTIAL)
    probe = profiler.run_probe(profiler.probes()[0])
    rows = [json.loads(line) for line in (tmp_path / probe.label / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["rollout/partial_carried_count"] >= 1 for r in rows)
    assert probe.points["rollout"][0] == 8  # the iteration's 1 prompt x 8 responses, not the 2 it holds
