"""Plan and WorkflowGraph: validation names what is wrong, the table shows every decision, JSON loads back equal."""

from __future__ import annotations

import pytest

from m2flow.planner import Component, ComponentPlan, Edge, EdgePlan, Fusion, Plan, PlanError, WorkflowGraph
from m2flow.runtime.placement import NodeLayout, parse_placement

GRAPH = WorkflowGraph(
    "toy",
    components=(Component("gen", "generates", holds_model=True), Component("score", "scores"),
                Component("extra", "optional work", optional=True), Component("train", "trains", holds_model=True)),
    edges=(Edge("items", "driver", "gen", "Item"), Edge("scored", "gen", "score", "Item"),
           Edge("batches", "score", "train", "Batch")),
    fusions=(Fusion("score", "gen", "same devices"), Fusion("gen", "train", "same devices")),
)


def _plan(placement: str, hosts: dict[str, str] | None = None, *, executor: str = "ray",
          active: dict[str, bool] | None = None) -> Plan:
    placed = parse_placement(placement, NodeLayout((4,)), GRAPH.component_names)
    hosts = hosts or {}
    comps = tuple(ComponentPlan(c, placed[c], hosts.get(c, c), active=(active or {}).get(c, True))
                  for c in GRAPH.component_names)
    edges = (EdgePlan("items", "driver", hosts.get("gen", "gen"), "channel"),)
    return Plan("toy", executor, placement, comps, edges, {"micro_batch": 4}, ("a note",))


def test_graph_rejects_unknown_ends_and_duplicates():
    with pytest.raises(ValueError, match="unknown component 'nope'"):
        WorkflowGraph("g", (Component("a", "x"),), (Edge("e", "a", "nope", "T"),))
    with pytest.raises(ValueError, match="duplicate component"):
        WorkflowGraph("g", (Component("a", "x"), Component("a", "y")), ())
    with pytest.raises(KeyError, match="has no component 'b'"):
        GRAPH.component("b")


def test_fusions_compose_transitively():
    assert ("score", "train") in GRAPH.fusion_closure()
    assert ("train", "gen") not in GRAPH.fusion_closure()


def test_a_valid_plan_round_trips_through_json(tmp_path):
    plan = _plan("all", {"score": "train", "gen": "train"}).validate(GRAPH)
    assert plan.launched == ("extra", "train")
    assert plan.mode == "collocated" and plan.fused("score")
    again = Plan.load(plan.save(tmp_path))
    assert again == plan
    assert list(again.placements().components) == ["extra", "train"]


def test_the_table_shows_devices_fusions_settings_and_notes():
    plan = _plan("gen,score: 0-1, extra: 2, train: 3", {"score": "gen"}).validate(GRAPH)
    table = plan.table()
    assert "hybrid" in table.splitlines()[0]  # gen and score share devices, the others do not
    rows = {line.split()[0]: line for line in table.splitlines()[2:6]}
    assert "0:0 0:1" in rows["gen"] and "gen (fused)" in rows["score"] and "own group" in rows["train"]
    assert "items: driver -> gen, channel" in table
    assert "micro_batch=4" in table and "note: a note" in table


@pytest.mark.parametrize("placement, hosts, active, executor, words", [
    ("gen,score: 0, extra,train: 1", {"train": "gen"}, None, "ray", "allows no such fusion"),
    ("gen: 0, score: 1, extra,train: 2", {"score": "gen"}, None, "ray", "does not sit on its devices"),
    ("all", {"score": "gen", "gen": "train"}, None, "ray", "not a group of its own"),
    ("all", None, {"train": False}, "ray", "not optional"),
    ("gen,score,extra: 0, train: 0-1", None, None, "local", "one rank per component"),
    ("all", None, None, "slurm", "executor must be"),
])
def test_invalid_plans_say_why(placement, hosts, active, executor, words):
    with pytest.raises(PlanError, match=words):
        _plan(placement, hosts, active=active, executor=executor).validate(GRAPH)


@pytest.mark.parametrize("text, words", [
    ("{", "not a valid plan"),
    ('{"format": 99}', "not a plan file of format"),
    ('{"format": 1, "workflow": "toy"}', "not a valid plan"),
])
def test_a_bad_plan_file_is_named(tmp_path, text, words):
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=words) as info:
        Plan.load(path)
    assert str(path) in str(info.value)
