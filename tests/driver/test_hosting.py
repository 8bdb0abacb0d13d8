"""The one fusion mechanism, driver side: the plan's fusions decide which settings each launched group gets
(``settings=`` its own, ``hosted=`` those of the components fused into it), and a fused component is
called through its host's group."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from m2flow.driver.launch import group_spec, hosted_settings
from m2flow.driver.workflow import Launch, Workflow
from m2flow.planner import Component, Edge, Fusion, WorkflowGraph
from m2flow.runtime.executors import LocalExecutor
from m2flow.runtime.hosting import HostedGroup
from m2flow.runtime.placement import NodeLayout
from m2flow.runtime.worker import Worker

HERE = "tests.driver.test_hosting"


@dataclass(frozen=True)
class PartSettings:
    """A component that can run inside another: its part answers with its tag and the host's rank."""

    tag: str

    def hosted_in(self, host: Worker) -> Part:
        return Part(self.tag, host)


class Part:
    def __init__(self, tag: str, host: Worker) -> None:
        self.tag, self.host = tag, host

    def where(self) -> str:
        return f"{self.tag} in {type(self.host).__name__}[{self.host.rank}]"


class Worker3(Worker):
    """The worker of every component: itself, plus what it hosts."""

    def __init__(self, *, settings: PartSettings, hosted: dict | None = None) -> None:
        self.tag = settings.tag
        self.host_components(hosted)

    def where(self) -> str:
        return f"{self.tag} alone [{self.rank}]"

    def hosts(self) -> list[str]:
        return sorted(p.tag for p in self.hosted_parts())


GRAPH = WorkflowGraph(
    "hosting_test",
    components=tuple(Component(c, c, worker=f"{HERE}:Worker3") for c in ("a", "b", "c")),
    edges=(Edge("ab", "a", "b", "x", kind="p2p"), Edge("bc", "b", "c", "x", kind="p2p")),
    fusions=(Fusion("c", "b", "same devices", key="fuse_cb"), Fusion("b", "a", "same devices", key="fuse_ba")),
)


@dataclass
class Cfg:
    placement: str = "a,b,c: 0-1"
    fuse_cb: bool = False
    fuse_ba: bool = False


class Three(Workflow):
    name = "hosting_test"
    schema = Cfg
    graph = GRAPH


def _plan(**fusions: bool):
    return Three().plan(Cfg(**fusions), NodeLayout((2,)))


def test_the_plan_names_each_hosts_guests_through_chains_of_fusions() -> None:
    assert _plan().guests("a") == () and _plan().launched == ("a", "b", "c")
    both = _plan(fuse_cb=True, fuse_ba=True)
    assert both.guests("a") == ("b", "c") and both.launched == ("a",)  # c into b into a: both in a
    assert _plan(fuse_cb=True).guests("b") == ("c",)


def test_group_specs_carry_settings_and_the_hosted_components_settings() -> None:
    wf, plan = Three(), _plan(fuse_cb=True)
    settings = {c: PartSettings(c) for c in "abc"}
    hosted = hosted_settings(GRAPH, "b", plan, settings)
    assert hosted == {"c": settings["c"]} and hosted_settings(GRAPH, "a", plan, settings) == {}
    spec = group_spec(GRAPH, "b", plan, settings["b"], hosted)
    assert spec.cls is Worker3 and spec.args == () and spec.kwargs == {"settings": settings["b"], "hosted": hosted}
    with pytest.raises(ValueError, match=r"no settings for \['c'\]"):
        hosted_settings(GRAPH, "b", plan, {"a": settings["a"], "b": settings["b"]})


def test_launched_groups_host_their_fused_components_and_calls_reach_them(tmp_path: Path) -> None:
    wf, plan = Three(), _plan(fuse_cb=True, fuse_ba=True)
    ex = LocalExecutor()
    try:
        run = Launch(tmp_path, None, None, None, None, 0, run_id="t")
        groups = wf.launch_plan(plan, ex, run, {c: PartSettings(c) for c in "abc"}).groups
        assert set(groups) == {"a", "b", "c"} and isinstance(groups["c"], HostedGroup)
        assert groups["a"].hosts().wait(10) == [["b", "c"], ["b", "c"]]
        assert groups["c"].where().wait(10) == ["c in Worker3[0]", "c in Worker3[1]"]
        assert groups["a"].where(ranks=[1]).wait(10) == ["a alone [1]"]
        with pytest.raises(ValueError, match=r"no settings for component\(s\) \['b'\]"):
            wf.launch_plan(plan, ex, run, {"a": PartSettings("a"), "c": PartSettings("c")})
    finally:
        ex.shutdown()
