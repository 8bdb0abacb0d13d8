"""Threads per rank on CPUs: a time measured in a process of n threads is not credited to ranks of fewer,
fused components run on their host's threads, and on a 2-core machine splitting a process into more
processes creates no cores: the search keeps the collocated single-process plan where it is fastest."""

from __future__ import annotations

import pytest

from m2flow.planner import Component, ComponentPlan, Edge, Fusion, Plan, WorkflowGraph
from m2flow.planner.cost import ComponentCost, CostModel, Link, fit_component
from m2flow.planner.search import SearchSpace, device_counts, search
from m2flow.planner.setup import Workload, build_setup, setup_from_plan
from m2flow.runtime.placement import NodeLayout, parse_placement

GRAPH = WorkflowGraph("toy", (Component("gen", "generates", holds_model=True),
                              Component("train", "trains", holds_model=True)),
                      (Edge("items", "gen", "train", "Item"), Edge("weights", "train", "gen", "w", kind="weights")),
                      (Fusion("gen", "train", "same devices"),))
WORKLOAD = Workload(chain=("gen", "train"), items=("batch",), micro_items=("micro",), inputs={"train": ("items",)},
                    weights=(("train", "gen"),))
# As the demo config: the generator's own ranks have 1 thread, the trainer (and a generator fused into it) 2.
SPACE = SearchSpace(GRAPH, WORKLOAD, ("gen", "train"), {"batch": 4, "micro": 4}, varied={"micro": (1, 2, 4)},
                    fusions=(("gen", "train"),),
                    threads={"gen": 1, "train": 2})


def _model(measured_threads: int, cores: int | None = 2) -> CostModel:
    """Both components measured, as the profiler's one-process probes do, in a process of 2 threads."""
    curve = ComponentCost(a=0.1, c=1.0, threads=measured_threads)
    return CostModel({"gen": curve, "train": curve}, link=Link(bandwidth=1e12, latency=0.0), cores=cores)


def test_a_curve_is_rescaled_to_the_threads_of_the_rank():
    two = ComponentCost(a=0.0, c=1.0, threads=2)
    assert two.time(4, 1) == 4.0 and two.time(4, 1, threads=2) == 4.0
    assert two.time(4, 1, threads=1) == pytest.approx(8.0)  # unmeasured scaling: all of the work is parallel
    half = ComponentCost(a=0.0, c=1.0, threads=2, parallel=0.5)  # speedup(2) = 1 / (0.5 + 0.25) = 4/3
    assert half.time(4, 1, threads=1) == pytest.approx(4 * 4 / 3)
    assert ComponentCost(c=1.0).time(4, 1, threads=1) == 4.0  # measured threads unknown: no rescaling
    cpu = CostModel({"x": two}, cores=2)
    gpu = CostModel({"x": two}, cores=None)
    assert cpu.call_time("x", 4, 1, 1) == pytest.approx(8.0) and gpu.call_time("x", 4, 1, 1) == 4.0


def test_fit_takes_the_thread_scaling_from_a_point_at_another_thread_count():
    # 2 threads: t = 0.01 + 0.001 b; the one-thread point took 1.5x as long -> f = 2/3 (speedup 1.5).
    pts = [(b, 1, 0.01 + 0.001 * b, 2) for b in (32, 64, 128)] + [(128, 1, 1.5 * (0.01 + 0.128), 1)]
    fit = fit_component(pts)
    assert fit.cost.threads == 2 and fit.cost.parallel == pytest.approx(2 / 3)
    assert fit.cost.a == pytest.approx(0.01) and fit.cost.c == pytest.approx(0.001)
    assert fit.cost.time(128, 1, 1) == pytest.approx(1.5 * 0.138) and fit.error < 1e-9
    # Old three-element points still fit, with no thread information.
    old = fit_component([(b, 1, 0.01 + 0.001 * b) for b in (32, 64)])
    assert old.cost.threads == 0 and old.cost.parallel == 1.0
    with pytest.raises(ValueError, match="threads"):
        fit_component([(8, 1, 0.1, 2, 5)])


def test_a_fused_component_runs_on_its_hosts_threads():
    setup = build_setup([(("gen", "train"), 0, 1)], {"gen": "train", "train": "train"}, {"batch": 4, "micro": 4},
                        threads={"gen": 1, "train": 2}, devices_per_node=1)
    assert setup.components["gen"].threads == 2
    apart = build_setup([(("gen",), 0, 1), (("train",), 1, 1)], {"gen": "gen", "train": "train"},
                        {"batch": 4, "micro": 4}, threads={"gen": 1, "train": 2}, devices_per_node=2)
    assert apart.components["gen"].threads == 1
    # The local executor runs every component in the driver, on the most threads any asks for.
    placed = parse_placement("gen,train: 0", NodeLayout((1,)), GRAPH.component_names)
    comps = (ComponentPlan("gen", placed["gen"], "gen", shares_devices=True, threads=1),
             ComponentPlan("train", placed["train"], "train", shares_devices=True, threads=2))
    local = Plan("toy", "local", "local", comps, (), {"batch": 4, "micro": 4}).validate(GRAPH)
    assert setup_from_plan(local).components["gen"].threads == 2


def test_one_thread_ranks_of_a_two_thread_measurement_do_not_beat_the_collocated_plan():
    # 2 cores. The measured process (2 threads) runs gen then train: 4.1 + 4.1 = 8.2 s. Apart, a gen
    # rank has 1 thread: its calls take twice the measured time, and 3 threads on 2 cores share them.
    result = search(SPACE, _model(measured_threads=2), 4, top=50)
    best = result.ranked[0]
    assert best.placement == "local" and best.choice.fused("gen", "train") and best.choice.values == {"micro": 4}
    assert best.result.iteration_time == pytest.approx(8.2)
    assert result.collocated is best
    assert all(c.result.iteration_time >= 8.2 - 1e-9 for c in result.ranked)
    # The same points with the threads left out credited a 1-thread rank with a 2-thread process's speed:
    # a disaggregated plan then looked faster on the same 2 cores.
    blind = search(SPACE, _model(measured_threads=0), 4, top=5).ranked[0]
    assert blind.shape.mode != "collocated" and blind.result.iteration_time < 8.2


def test_cpu_searches_try_fewer_devices_and_gpu_searches_all():
    assert device_counts(8, cores=2) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert device_counts(8, cores=None) == [8]
    assert device_counts(64, cores=2, exact_limit=16) == [4, 8, 16, 32, 64]
    # On GPUs the collocated plan still spans every device ("all").
    gpu = search(SPACE, _model(measured_threads=2, cores=None), 2, top=50)
    assert {c.placement for c in gpu.ranked if c.shape.mode == "collocated"} == {"all"}


def test_a_profile_the_older_profiler_wrote_is_stale_one_entered_by_hand_is_read():
    from m2flow.planner.profile_file import ProfileError, check_profile, new_profile

    machine = {"hostname": "vm", "cores": 2, "torch": "t", "m2flow": "m"}
    current = new_profile("toy", "h", {}, machine=machine)
    check_profile(current, "toy", "h", machine)
    check_profile({**current, "format": 1}, "toy", "h", machine)  # by hand: no probes
    with pytest.raises(ProfileError, match="older m2flow profile .*profile again"):
        check_profile({**current, "format": 1, "probes": []}, "toy", "h", machine)
    with pytest.raises(ProfileError, match="not a profile of format 2"):
        check_profile({**current, "format": 7}, "toy", "h", machine)


def test_a_rank_count_probed_at_fewer_threads_shapes_the_curve_at_the_configured_threads():
    # Truth at 2 threads: t = 0.01 + 0.001 b / d + 0.05 log2(d); a 2-thread process is 1/0.6 as fast
    # as a 1-thread one (parallel fraction 0.8).
    true = ComponentCost(0.01, 0.001, 1.0, 0.05, threads=2, parallel=0.8)
    slower = true.speedup(2) / true.speedup(1)
    pts = [(b, 1, true.time(b, 1), 2) for b in (8, 16, 32)]
    pts += [(32, 1, true.time(32, 1) * slower, 1),  # the one-thread probe
            (32, 2, true.time(32, 2) * slower, 1)]  # two ranks, at one thread each to fit on two cores
    fit = fit_component(pts).cost
    assert fit.threads == 2 and fit.parallel == pytest.approx(0.8)
    assert fit.time(32, 2) == pytest.approx(true.time(32, 2), rel=1e-6)  # the collective is in the curve
    assert fit.time(32, 2, 1) == pytest.approx(true.time(32, 2) * slower, rel=1e-6)
