"""The one Plan builder: fusions, edges, turns and offloads decided from the graph and a choice alone,
a workflow's rules adding only what its config says."""

from __future__ import annotations

import pytest

from m2flow.planner import Component, Edge, Fusion, PlanError, WorkflowGraph
from m2flow.planner.build import PlanRules, build_plan
from m2flow.planner.choice import PlanChoice
from m2flow.planner.graph import DRIVER
from m2flow.runtime.placement import NodeLayout

# A chain like reasoning RL's: gen -> score -> check (optional) -> train, weights back to gen.
GRAPH = WorkflowGraph(
    name="chain",
    components=(Component("gen", "generates", holds_model=True), Component("score", "scores"),
                Component("check", "checks", holds_model=True, optional=True),
                Component("train", "trains", holds_model=True, trains=True)),
    edges=(Edge("tasks", DRIVER, "gen", "task"), Edge("out", "gen", "score", "sample"),
           Edge("scored", "score", "check", "sample"), Edge("ready", "check", "train", "sample"),
           Edge("weights", "train", "gen", "state dict", kind="weights")),
    fusions=(Fusion("score", "gen", "on gen's devices"), Fusion("gen", "train", "on train's devices")),
)
LAYOUT = NodeLayout((4,))


def test_a_fusion_chain_lands_in_the_last_host_and_a_weight_sync_inside_one_process_is_unused():
    plan = build_plan(GRAPH, PlanChoice.of("all", [("score", "gen"), ("gen", "train")]), LAYOUT)
    assert plan["score"].host == "train" and plan["gen"].host == "train" and plan.launched == ("check", "train")
    assert plan.edge("out").transport == "in-process" and plan.edge("weights").transport == "unused"
    assert plan.edge("tasks").target == "train" and plan.edge("tasks").transport == "channel"


def test_an_edge_into_a_component_that_does_not_run_goes_on_where_its_stream_goes():
    rules = PlanRules(inactive={"check": "check does not run"})
    plan = build_plan(GRAPH, PlanChoice.of("gen,score: 0, check: 1, train: 2-3"), LAYOUT, rules)
    scored, ready = plan.edge("scored"), plan.edge("ready")
    assert (scored.source, scored.target, scored.transport, scored.consumers) == ("score", "train", "channel", 2)
    assert (ready.transport, ready.consumers) == ("unused", 0) and not plan.runs("check")
    assert plan.notes == ("check does not run",)


def test_a_fusion_off_its_hosts_devices_or_refused_by_the_rules_is_not_taken_and_says_why():
    apart = build_plan(GRAPH, PlanChoice.of("gen: 0, score: 1, check: 2, train: 3", [("score", "gen")]), LAYOUT)
    assert not apart.fused("score")
    assert apart.notes == ("score runs as its own group: it is not on gen's devices rank for rank",)
    rules = PlanRules(refused={("gen", "train"): "gen runs as its own group: train is sharded"})
    refused = build_plan(GRAPH, PlanChoice.of("all", [("gen", "train")]), LAYOUT, rules)
    assert not refused.fused("gen") and refused.notes == ("gen runs as its own group: train is sharded",)


def test_model_groups_on_shared_devices_take_turns_and_offload_unless_the_rules_say_not():
    rules = PlanRules(offload={"train": False})
    plan = build_plan(GRAPH, PlanChoice.of("gen,score: 0, check: 1, train: 0-1"), LAYOUT, rules)
    assert [c.name for c in plan.components if c.shares_devices] == ["gen", "check", "train"]
    assert plan["gen"].offload and not plan["train"].offload and not plan["score"].shares_devices
    # A holder fused into a group that holds none makes that group the one that takes turns (its model moves).
    host = WorkflowGraph("host", (Component("env", "steps"), Component("policy", "acts", holds_model=True),
                                  Component("learn", "learns", holds_model=True)), (),
                         (Fusion("policy", "env", "on env's devices"),))
    fused = build_plan(host, PlanChoice.of("all", [("policy", "env")]), LAYOUT)
    assert fused["env"].shares_devices and fused["env"].offload and not fused["policy"].shares_devices


def test_the_rules_settings_see_the_decided_structure_and_may_refuse_the_plan():
    def settings(plan):
        if plan.fused("gen"):
            raise PlanError("no fused gen here")
        return {"groups": len(plan.launched)}, ("settled",)

    plan = build_plan(GRAPH, PlanChoice.of("all"), LAYOUT, PlanRules(settings=settings))
    assert plan.settings == {"groups": 4} and plan.notes == ("settled",)
    with pytest.raises(PlanError, match="no fused gen"):
        build_plan(GRAPH, PlanChoice.of("all", [("gen", "train")]), LAYOUT, PlanRules(settings=settings))
