"""Simulator: reproduces hand-computed pipeline, turn-taking, offload and contention timings exactly."""

from __future__ import annotations

import pytest

from m2flow.planner import Component, ComponentPlan, Edge, Plan, WorkflowGraph
from m2flow.planner.bound import FastBound
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.setup import Workload, build_setup, setup_from_plan
from m2flow.planner.simulate import Simulator, write_trace
from m2flow.runtime.placement import NodeLayout, parse_placement

GRAPH = WorkflowGraph("toy", (Component("gen", "generates", holds_model=True),
                              Component("train", "trains", holds_model=True)),
                      (Edge("items", "gen", "train", "Item"), Edge("weights", "train", "gen", "w", kind="weights")))
WORKLOAD = Workload(chain=("gen", "train"), items=("batch",), micro_items=("micro",), inputs={"train": ("items",)},
                    weights=(("train", "gen"),), categories={"gen": "generate", "train": "train"})
LOOP_GRAPH = WorkflowGraph("loop", (Component("env", "steps"), Component("policy", "acts", holds_model=True),
                                    Component("train", "trains", holds_model=True)), ())
LOOP = Workload(chain=("train",), items=("envs", "steps"), loop=("env", "policy"), loop_steps="steps",
                loop_items=("envs",), stages="stages")


def _model(gen: float, train: float, **kw) -> CostModel:
    return CostModel({"gen": ComponentCost(a=gen, state_bytes=kw.pop("gen_state", 0.0)),
                      "train": ComponentCost(a=train, state_bytes=kw.pop("train_state", 0.0))},
                     link=Link(latency=0.0), **kw)


def _sim(model: CostModel, blocks, settings, iterations: int = 1, hosts=None):
    setup = build_setup(blocks, hosts or {}, settings, holders=("gen", "train"))
    return Simulator(GRAPH, WORKLOAD, model).simulate(setup, iterations), setup


def test_two_stage_pipeline_makespan_is_hand_computed():
    # Stages of 3 s and 2 s on their own devices over 4 micro-batches: 3 * 4 + 2.
    result, _ = _sim(_model(3.0, 2.0), [(("gen",), 0, 1), (("train",), 1, 1)], {"batch": 4, "micro": 1})
    assert result.iteration_time == pytest.approx(14.0)
    assert result.bottleneck == "gen"
    assert result.utilisation()["0:0"] == pytest.approx(12 / 14)
    assert result.idle()["0:0"] == [(12.0, 14.0)]  # gen waits for the last train call
    assert result.idle()["0:1"] == [(0.0, 3.0), (5.0, 6.0), (8.0, 9.0), (11.0, 12.0)]


def test_collocated_components_take_turns_and_sum():
    result, setup = _sim(_model(3.0, 2.0), [(("gen", "train"), 0, 2)], {"batch": 4, "micro": 1})
    assert setup.components["gen"].takes_turns and setup.components["train"].takes_turns
    assert result.iteration_time == pytest.approx(4 * 3 + 4 * 2)


def test_offload_costs_add_between_turns():
    model = _model(3.0, 2.0, gen_state=1e9, train_state=2e9, offload_bandwidth=1e9)
    one, _ = _sim(model, [(("gen", "train"), 0, 1)], {"batch": 4, "micro": 1})
    # The weight sync (2e9 bytes at 1e9 B/s), gen's four calls, then one turn change: gen offloads
    # (1 s), train onloads (2 s).
    assert one.iteration_time == pytest.approx(2 + 20 + 1 + 2)
    two, _ = _sim(model, [(("gen", "train"), 0, 1)], {"batch": 4, "micro": 1}, iterations=2)
    # A steady iteration changes hands twice: train -> gen (2 + 1) and gen -> train (1 + 2).
    assert two.iteration_time == pytest.approx(2 + 20 + 6)


def test_weight_sync_and_edge_transfer_cost_when_processes_differ():
    model = CostModel({"gen": ComponentCost(a=1.0), "train": ComponentCost(a=1.0, state_bytes=3e9)},
                      edge_bytes={"items": 1e9}, link=Link(bandwidth=1e9, latency=0.0))
    setup = build_setup([(("gen",), 0, 1), (("train",), 1, 1)], {}, {"batch": 1, "micro": 1})
    result = Simulator(GRAPH, WORKLOAD, model).simulate(setup, iterations=2)
    assert result.iteration_time == pytest.approx(3 + 1 + (1 + 1))  # sync, gen, transfer + train


@pytest.mark.parametrize("gen,train", [(3.0, 2.0), (2.0, 3.0)])
def test_running_ahead_overlaps_generation_with_the_training_before(gen, train):
    # Own devices, one item: on-policy an iteration is gen + train; one iteration ahead, iteration 1's
    # generation runs beside iteration 0's training, so a steady iteration takes the slower of the two.
    ahead = Workload(**{**WORKLOAD.__dict__, "run_ahead": "ahead"})
    blocks = [(("gen",), 0, 1), (("train",), 1, 1)]
    for steps_ahead, expected in ((0, gen + train), (1, max(gen, train)), (2, max(gen, train))):
        setup = build_setup(blocks, {}, {"batch": 1, "micro": 1, "ahead": steps_ahead}, holders=("gen", "train"))
        simulated = Simulator(GRAPH, ahead, _model(gen, train)).simulate(setup, 2).iteration_time
        assert simulated == pytest.approx(expected)
        bound, _ = FastBound(GRAPH, ahead, _model(gen, train), setup).evaluate({"gen": 1, "train": 1})
        assert bound == pytest.approx(expected)  # tight here, and never above the simulation
    # Without the setting in the workload, a plan is priced on-policy whatever it says.
    setup = build_setup(blocks, {}, {"batch": 1, "micro": 1, "ahead": 1}, holders=("gen", "train"))
    on_policy = Simulator(GRAPH, WORKLOAD, _model(gen, train)).simulate(setup, 2)
    assert on_policy.iteration_time == pytest.approx(gen + train)


def test_cpu_contention_slows_overlapping_calls():
    blocks, settings = [(("gen",), 0, 1), (("train",), 1, 1)], {"batch": 2, "micro": 1}
    free, _ = _sim(_model(2.0, 2.0), blocks, settings)
    assert free.iteration_time == pytest.approx(6.0)
    # One core: gen mb1 and train mb0 overlap at half speed each (4 s), then train mb1 alone.
    setup = build_setup(blocks, {}, settings, holders=("gen", "train"), devices_per_node=2)
    shared = Simulator(GRAPH, WORKLOAD, _model(2.0, 2.0, cores=1)).simulate(setup, 1)
    assert shared.iteration_time == pytest.approx(2 + 4 + 2)


def test_multi_threaded_processes_beyond_the_cores_run_oversubscribed_times_slower_still():
    blocks, settings = [(("gen",), 0, 1), (("train",), 1, 1)], {"batch": 2, "micro": 1}
    model = _model(2.0, 2.0, cores=2, oversubscribed=3.0)
    one = build_setup(blocks, {}, settings, holders=("gen", "train"), devices_per_node=2,
                      threads={"gen": 1, "train": 1})
    # One thread each: two threads on two cores, no sharing at all.
    assert Simulator(GRAPH, WORKLOAD, model).simulate(one, 1).iteration_time == pytest.approx(6.0)
    two = build_setup(blocks, {}, settings, holders=("gen", "train"), devices_per_node=2,
                      threads={"gen": 2, "train": 2})
    # Two threads each: while both run, 4 threads on 2 cores (half speed) and 3x slower still, so the
    # overlapping 2 s calls take 12 s.
    assert Simulator(GRAPH, WORKLOAD, model).simulate(two, 1).iteration_time == pytest.approx(2 + 12 + 2)
    assert model.speed(4, threads=1) == pytest.approx(0.5) and model.speed(2, threads=2) == 1.0


def test_loop_stages_overlap_env_and_policy():
    model = CostModel({"env": ComponentCost(a=2.0), "policy": ComponentCost(a=1.0), "train": ComponentCost(a=5.0)},
                      link=Link(latency=0.0))
    blocks = [(("env",), 0, 1), (("policy",), 1, 1), (("train",), 0, 2)]
    sim = Simulator(LOOP_GRAPH, LOOP, model)
    one = sim.simulate(build_setup(blocks, {}, {"envs": 4, "steps": 3, "stages": 1}), 1)
    assert one.iteration_time == pytest.approx(3 * (1 + 2) + 5)
    # Two stages: calls keep their fixed cost; env is busy 2 * 3 * 2 = 12 s, starting after 1 s.
    two = sim.simulate(build_setup(blocks, {}, {"envs": 4, "steps": 3, "stages": 2}), 1)
    assert two.iteration_time == pytest.approx(1 + 12 + 5)


def test_setup_from_a_plan_matches_the_direct_setup_and_traces(tmp_path):
    placed = parse_placement("gen: 0, train: 1", NodeLayout((2,)), ("gen", "train"))
    plan = Plan("toy", "ray", "gen: 0, train: 1",
                tuple(ComponentPlan(c, placed[c], c) for c in ("gen", "train")), (), {"batch": 4, "micro": 1})
    from_plan = setup_from_plan(plan)
    direct = build_setup([(("gen",), 0, 1), (("train",), 1, 1)], {}, {"batch": 4, "micro": 1})
    assert [k.label for k in from_plan.classes] == [k.label for k in direct.classes] == ["0:0", "0:1"]
    sim = Simulator(GRAPH, WORKLOAD, _model(3.0, 2.0))
    result = sim.simulate(from_plan, iterations=3)
    assert result.iteration_time == pytest.approx(sim.simulate(direct, 3).iteration_time)
    path = write_trace(result, from_plan, tmp_path)
    from m2flow.report.report import build_report

    report = build_report(tmp_path, plots=False)
    assert len(report.analysis.steps) == 3
    assert report.analysis.steps[-1].duration == pytest.approx(result.iteration_time)
    assert path.name == "trace.json"


def test_a_receiver_pays_a_message_per_sender_rank_it_serves():
    graph = WorkflowGraph("fan", (Component("gen", "generates"), Component("train", "trains")),
                          (Edge("items", "gen", "train", "Item"),))
    work = Workload(chain=("gen", "train"), items=("batch",), inputs={"train": ("items",)})
    model = CostModel({"gen": ComponentCost(a=1.0), "train": ComponentCost(a=1.0)}, link=Link(latency=0.5))
    setup = build_setup([(("gen",), 0, 4), (("train",), 4, 1)], {}, {"batch": 4})
    # Four gen ranks send to one train rank: four latencies before it trains; and the driver's call to
    # each component's processes is a message too (a latency per call).
    assert Simulator(graph, work, model).simulate(setup, 1).iteration_time == pytest.approx(
        0.5 + 1 + 0.5 + 4 * 0.5 + 1)
    # All in the driver (one rank each on device 0): no message at all.
    alone = build_setup([(("gen", "train"), 0, 1)], {"gen": "train"}, {"batch": 4})
    assert alone.in_driver and Simulator(graph, work, model).simulate(alone, 1).iteration_time == pytest.approx(2)


def test_in_the_driver_a_hand_off_between_rank_threads_costs_the_local_latency():
    graph = WorkflowGraph("pair", (Component("gen", "generates"), Component("train", "trains")),
                          (Edge("items", "gen", "train", "Item"),))
    work = Workload(chain=("gen", "train"), items=("batch",), inputs={"train": ("items",)})
    model = CostModel({"gen": ComponentCost(a=1.0), "train": ComponentCost(a=1.0)}, edge_bytes={"items": 1e9},
                      link=Link(bandwidth=1e9, latency=0.5, local_latency=0.25, dispatch=0.75))
    sim = Simulator(graph, work, model)
    threads = build_setup([(("gen",), 0, 1), (("train",), 0, 1)], {}, {"batch": 1})
    # Two rank threads of the driver: one hand-off, no bytes, no call to another process.
    assert threads.in_driver and sim.simulate(threads, 1).iteration_time == pytest.approx(1 + 0.25 + 1)
    apart = build_setup([(("gen",), 0, 1), (("train",), 1, 1)], {}, {"batch": 1})
    # Two processes: the driver's call to each (0.75), the message (0.5) and its bytes (1 s).
    assert sim.simulate(apart, 1).iteration_time == pytest.approx(0.75 + 1 + 0.75 + 0.5 + 1 + 1)
