"""Search: finds the known optimum of small hand-made workflows, honours memory limits, and builds Plans
through the workflow's own plan function."""

from __future__ import annotations

from typing import Any

import pytest

from m2flow.planner import Component, ComponentPlan, Edge, Fusion, Plan, WorkflowGraph
from m2flow.planner.choice import PlanChoice
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.search import SearchSpace, compositions, search, set_partitions, shapes
from m2flow.planner.setup import Workload
from m2flow.runtime.placement import NodeLayout, parse_placement

GRAPH = WorkflowGraph("toy", (Component("gen", "generates", holds_model=True),
                              Component("train", "trains", holds_model=True)),
                      (Edge("items", "gen", "train", "Item"), Edge("weights", "train", "gen", "w", kind="weights")),
                      (Fusion("gen", "train", "same devices"),))
WORKLOAD = Workload(chain=("gen", "train"), items=("batch",), micro_items=("micro",), inputs={"train": ("items",)},
                    weights=(("train", "gen"),))
SPACE = SearchSpace(GRAPH, WORKLOAD, ("gen", "train"), {"batch": 4, "micro": 4}, varied={"micro": (1, 2, 4)},
                    fusions=(("gen", "train"),))


def _model(alpha: float, edge_bytes: float = 0.0, **kw: Any) -> CostModel:
    return CostModel({c: ComponentCost(a=0.1, c=1.0, alpha=alpha, **kw.pop(c, {})) for c in ("gen", "train")},
                     edge_bytes={"items": edge_bytes}, link=Link(bandwidth=1.0, latency=0.0), **kw)


def test_enumeration_counts():
    assert len(list(set_partitions(["a", "b", "c"]))) == 5  # Bell(3)
    assert len(list(compositions(8, 3))) == 21  # C(7, 2)
    modes = [s.mode for s in shapes(["a", "b", "c"])]
    # hybrids: 3 with one component over two blocks, 3 * (1 + 2) with one inside a block
    assert modes.count("collocated") == 1 and modes.count("disaggregated") == 4 and modes.count("hybrid") == 3 + 9


def test_a_pipelined_plan_wins_when_work_scales_poorly():
    # alpha 0.5: two devices do not halve a call, so two 1-device stages over 4 micro-batches
    # (4 * 1.1 + 1.1 = 5.5 s) beat taking turns on both devices (2 * (0.1 + 4 / sqrt 2) = 5.76 s).
    result = search(SPACE, _model(0.5), 2, top=3)
    best = result.ranked[0]
    assert result.exact and best.placement == "gen: 0, train: 1" and best.choice.values == {"micro": 1}
    assert best.result.iteration_time == pytest.approx(5.5)
    assert best.result.bottleneck == "gen"


def test_collocated_fused_wins_when_edges_are_heavy():
    # 1 byte per item at 1 B/s: crossing processes costs 1 s per item; fused, it costs nothing.
    result = search(SPACE, _model(1.0, edge_bytes=1.0), 2, top=3)
    best = result.ranked[0]
    assert best.choice == PlanChoice("all", (("gen", "train"),), (("micro", 4),))
    assert best.result.iteration_time == pytest.approx(2 * (0.1 + 4 / 2))
    assert best.shape.mode == "collocated"


def test_memory_limits_are_honoured_with_the_reason():
    gib = 2.0 ** 30
    model = _model(1.0, gen={"mem_per_item": 4 * gib}, device_memory=12 * gib)
    result = search(SPACE, model, 1, top=3)
    assert result.ranked and all(c.choice.values["micro"] < 4 for c in result.ranked)
    # Every micro-batch-4 candidate is refused for memory; the fastest of them is named, with why.
    from m2flow.planner.search import MEMORY

    assert result.reasons[MEMORY] == result.unfit > 0
    best = result.best_rejected
    assert best is not None and best.choice.values["micro"] == 4 and best.result is not None
    assert "devices 0:0 need 16.0 GiB each (gen 16.0, train 0.0), more than the 12.0 GiB" in best.rejected


def _toy_plan(cfg: dict[str, Any], layout: NodeLayout) -> Plan:
    """A plan function as a workflow writes one (of a config as a dict): it refuses micro-batches of 2."""
    if cfg["micro"] == 2:
        raise ValueError("micro must not be 2 in this toy")
    placed = parse_placement(cfg["placement"], layout, GRAPH.component_names)
    fused = cfg["fuse"] and placed["gen"].same_devices(placed["train"])
    shares = bool(placed["gen"].devices & placed["train"].devices)
    comps = (ComponentPlan("gen", placed["gen"], "train" if fused else "gen", shares_devices=shares and not fused,
                           offload=shares and not fused),
             ComponentPlan("train", placed["train"], "train", shares_devices=shares and not fused,
                           offload=shares and not fused))
    return Plan("toy", "ray", cfg["placement"], comps, (), {"batch": 4, "micro": cfg["micro"]}).validate(GRAPH)


def test_candidates_become_plans_through_the_plan_function():
    base = {"placement": "all", "micro": 4, "fuse": False}
    asked: list[PlanChoice] = []

    def build(choice: PlanChoice) -> Plan:
        # As a workflow does it: the config asks for the choice, the plan function plans the config.
        asked.append(choice)
        cfg = {**base, "placement": choice.placement, "fuse": choice.fused("gen", "train"), **choice.values}
        return _toy_plan(cfg, NodeLayout((2,)))

    result = search(SPACE, _model(0.5), 2, top=30, build_plan=build)
    best = result.ranked[0]
    assert isinstance(best.plan, Plan) and best.plan.placement == "gen: 0, train: 1"
    assert best.result.iteration_time == pytest.approx(5.5)
    assert any("the plan function refused it: micro must not be 2" in c.rejected for c in result.rejected)
    assert all(c.choice.values["micro"] != 2 for c in result.ranked)
    # Every ranked plan is the one built from its choice; choices speak plan settings, not config keys.
    assert all(c.plan.settings["micro"] == c.choice.values["micro"] for c in result.ranked)
    assert {name for c in asked for name in c.values} == {"micro"}


def test_the_scalable_search_stays_close_to_exhaustive():
    three = WorkflowGraph("three", tuple(Component(c, c, holds_model=True) for c in ("a", "b", "c")), ())
    work = Workload(chain=("a", "b", "c"), items=("batch",), micro_items=("micro",))
    space = SearchSpace(three, work, ("a", "b", "c"), {"batch": 64, "micro": 8})
    model = CostModel({"a": ComponentCost(0.2, 3.0, 0.7), "b": ComponentCost(0.1, 1.0, 0.9),
                       "c": ComponentCost(0.5, 2.0, 0.6)}, link=Link(latency=0.0))
    exact = search(space, model, 24, exact_limit=64, top=1)
    fast = search(space, model, 24, exact_limit=8, top=1)
    assert exact.exact and not fast.exact and fast.considered < exact.considered
    gap = fast.ranked[0].result.iteration_time / exact.ranked[0].result.iteration_time - 1
    assert 0.0 <= gap < 0.05


def test_the_actor_on_part_of_the_env_devices_wins_when_collectives_cost():
    # E2's winner in shape: two fused env ranks, the actor on one of their devices (its all-reduce
    # costs more than a second rank saves).
    graph = WorkflowGraph("loop", (Component("env", "steps"), Component("policy", "acts", holds_model=True),
                                   Component("train", "trains", holds_model=True)),
                          (Edge("obs", "env", "policy", "Obs"), Edge("actions", "policy", "env", "Actions")),
                          (Fusion("policy", "env", "same devices"),))
    # Each env step's messages cost a latency when env and policy are different processes.
    work = Workload(chain=("train",), items=("envs", "steps"), items_per_rank_of="env", loop=("env", "policy"),
                    loop_steps="steps", loop_items=("envs",), inputs={"policy": ("obs",), "env": ("actions",)})
    space = SearchSpace(graph, work, ("env", "policy", "train"), {"envs": 4, "steps": 8},
                        fusions=(("policy", "env"),))
    model = CostModel({"env": ComponentCost(0.001, 0.01), "policy": ComponentCost(0.002, 0.001),
                       "train": ComponentCost(0.05, 0.0005, 1.0, s=0.2)}, link=Link(latency=1e-3))
    best = search(space, model, 2, top=1).ranked[0]
    assert best.placement == "env,policy: 0-1, train: 0" and best.choice.fused("policy", "env")
    assert best.shape.mode == "hybrid"


def test_the_fast_bound_never_exceeds_the_simulation():
    from m2flow.planner.search import Searcher

    for alpha, edge, cores in ((0.5, 0.0, None), (1.0, 1.0, None), (0.7, 0.3, None), (0.7, 0.3, 1)):
        model = _model(alpha, edge, gen={"state_bytes": 1.0}, offload_bandwidth=1.0, cores=cores)
        searcher = Searcher(SPACE, model, 4)
        entries = searcher.entries()
        assert len(entries) > 30
        for entry in entries[::3]:
            cand = searcher._candidate(entry)
            assert cand.bound == pytest.approx(searcher.bound(cand.setup))
            assert cand.bound <= searcher.sim.simulate(cand.setup).iteration_time + 1e-9


def test_nothing_in_the_planner_but_the_graphs_declarations_reads_a_config_key():
    """The search states plans as PlanChoices; the config keys a workflow declares in its graph (a fusion's
    key, a component's threads key) are read by the workflow's side alone (``Workflow.apply``)."""
    import ast
    from pathlib import Path

    import m2flow.planner as planner

    declared = {"key", "section", "threads_key", "fusion_keys", "thread_keys"}
    for path in sorted(Path(planner.__file__).parent.glob("*.py")):
        if path.name == "graph.py":  # where the declarations live
            continue
        read = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        assert not read & declared, f"{path.name} reads {sorted(read & declared)}"
