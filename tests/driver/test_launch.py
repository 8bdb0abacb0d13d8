"""``launch_plan`` wires a run from the Plan alone: a stream for each data edge the plan runs between processes
(with the plan's consumers and lanes), none for an edge into a hosted component, a view for each fused
component, one group per rank for a ``rank_groups`` component, each of them restarted alone; a launch that
fails leaves no stream behind."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from m2flow.driver.launch import RankGroups, Wiring, launch_plan
from m2flow.planner import Component, Edge, Fusion, Plan, WorkflowGraph
from m2flow.planner.build import PlanRules, build_plan
from m2flow.planner.choice import PlanChoice
from m2flow.planner.graph import DRIVER
from m2flow.runtime.executors import LocalExecutor
from m2flow.runtime.hosting import HostedGroup
from m2flow.runtime.placement import NodeLayout
from m2flow.runtime.streams import GroupStream
from m2flow.runtime.worker import Worker

GRAPH = WorkflowGraph(
    "launch_test",
    components=(
        Component("gen", "makes items", worker=f"{__name__}:Part"),
        Component("score", "scores them", worker=f"{__name__}:Part"),
        Component("learn", "takes them", worker=f"{__name__}:Part"),
        Component("env", "answers gen's calls", worker=f"{__name__}:Part", rank_groups=True),
    ),
    edges=(Edge("tasks", DRIVER, "gen", "Item"), Edge("made", "gen", "score", "Item"),
           Edge("scored", "score", "learn", "Item"), Edge("acts", "gen", "env", "text", kind="p2p")),
    fusions=(Fusion("score", "gen", "same devices", key="score.fuse"),),
)


@dataclass(frozen=True)
class Item:
    slot: int
    step: int


@dataclass(frozen=True)
class PartSettings:
    tag: str
    takes: GroupStream | None = None
    """the stream the part takes its items from"""

    def hosted_in(self, host: Worker) -> HostedPart:
        return HostedPart(self.tag)


@dataclass(frozen=True)
class HostedPart:
    name: str

    def tag(self) -> str:
        return f"{self.name} hosted"


class Part(Worker):
    def __init__(self, *, settings: PartSettings, hosted: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.host_components(hosted)

    def tag(self) -> str:
        return self.settings.tag

    def take(self, count: int, step: int) -> list[int]:
        assert self.settings.takes is not None
        return [item.slot for item in self.settings.takes.take(self.rank, count, step)]


def _plan(placement: str, fused: bool = False, staleness: int = 0) -> Plan:
    choice = PlanChoice.of(placement, [("score", "gen")] if fused else [])
    return build_plan(GRAPH, choice, NodeLayout((2,)), PlanRules(settings=lambda p: ({"max_staleness": staleness}, ())))


def _settings(wiring: Wiring) -> dict[str, PartSettings]:
    return {"gen": PartSettings("gen"), "score": PartSettings("score"),
            "learn": PartSettings("learn", wiring.streams["scored"]), "env": PartSettings("env")}


def _launch(plan: Plan, ex: LocalExecutor, tmp_path: Path, settings: Any = _settings):
    return launch_plan(GRAPH, plan, ex, "t", tmp_path / "logs", None, settings)


def test_every_edge_between_processes_gets_the_stream_the_plan_gives_it(tmp_path: Path) -> None:
    plan = _plan("gen,score,env: 0-1, learn: 0-1", staleness=1)
    ex = LocalExecutor()
    try:
        launched = _launch(plan, ex, tmp_path)
        streams = launched.streams
        assert set(streams) == {"tasks", "made", "scored"}  # "acts" is point to point: no stream
        assert {n: (s.consumers, s.lanes) for n, s in streams.items()} == \
            {"tasks": (2, 1), "made": (2, 2), "scored": (2, 2)}  # the driver feeds in order; the others by iteration
        assert launched.names == {c: f"{c}-t" for c in GRAPH.component_names}
        # The learner's settings got the very stream the plan made for its edge: what the driver puts, it takes.
        streams["scored"].put_many([Item(slot, 0) for slot in range(4)])
        assert launched["learn"].take(2, 0).wait(10) == [[0, 2], [1, 3]]
        assert [g.tag().wait(10) for g in (launched["gen"], launched["score"])] == [["gen"] * 2, ["score"] * 2]
    finally:
        ex.shutdown()


def test_a_fused_component_is_a_view_of_its_host_and_its_edge_from_the_host_has_no_stream(tmp_path: Path) -> None:
    plan = _plan("gen,score,env: 0-1, learn: 0-1", fused=True)
    assert plan.edge("made").transport == "in-process"
    ex = LocalExecutor()
    try:
        launched = _launch(plan, ex, tmp_path)
        assert set(launched.streams) == {"tasks", "scored"}  # the host hands "made" to its part by a call
        assert isinstance(launched["score"], HostedGroup) and launched["score"].host is launched["gen"]
        assert launched["score"].tag().wait(10) == ["score hosted"] * 2  # the part hosted on each gen rank
        assert set(launched.groups) == {"gen", "score", "learn", "env"}
    finally:
        ex.shutdown()


def test_a_rank_groups_component_runs_a_group_per_rank_and_restarts_one_alone(tmp_path: Path) -> None:
    plan = _plan("gen,score,learn: 0, env: 0-1")
    ex = LocalExecutor()
    try:
        env = _launch(plan, ex, tmp_path)["env"]
        assert isinstance(env, RankGroups) and env.world_size == 2
        assert [env[r].name for r in range(2)] == ["env0-t", "env1-t"] and all(g.world_size == 1 for g in env.groups)
        kept = env[0]
        env.restart(1)
        assert env[0] is kept and env[1].name == "env1-t-r1" and env.restarts == 1
        assert env.execute("tag", ranks=[1]).wait(10) == ["env"]  # calls reach the new group
        with pytest.raises(ValueError, match="one rank at a time"):
            env.execute("tag", ranks=[0, 1])
    finally:
        ex.shutdown()


def test_a_launch_that_fails_releases_the_streams_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    destroyed: list[str] = []
    real = GroupStream.destroy
    monkeypatch.setattr(GroupStream, "destroy", lambda self: (destroyed.append(self.name), real(self)))
    ex = LocalExecutor()
    try:
        with pytest.raises(ValueError, match=r"no settings for component\(s\) \['env'\]"):
            _launch(_plan("gen,score,env: 0-1, learn: 0-1"), ex, tmp_path,
                    lambda wiring: {c: s for c, s in _settings(wiring).items() if c != "env"})
        assert sorted(destroyed) == ["made-t", "scored-t", "tasks-t"]
        with pytest.raises(ValueError, match="cannot host"):  # a group per rank hosts nothing
            plan = _plan("gen,score,env: 0-1, learn: 0-1", fused=True)
            moved = replace(plan, components=tuple(replace(c, host="env") if c.name == "score" else c
                                                   for c in plan.components))
            _launch(moved, ex, tmp_path)
    finally:
        ex.shutdown()
