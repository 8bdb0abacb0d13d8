"""A Plan changed in memory is what runs: a fusion, a placement, threads and a pipeline depth edited on the Plan
object, with the config left as it was, reach the executor's groups and the workers as they are: the executor
is asked for exactly the Plan's launched groups, on the Plan's devices, with the Plan's threads and fusions."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from m2flow.driver.run import Run
from m2flow.planner import Plan
from m2flow.runtime.placement import NodeLayout, parse_placement
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
from tests.workflows.embodied.setup import toy_config


def _fuse(plan: Plan, component: str, host: str) -> Plan:
    """``plan`` with ``component`` run inside ``host``'s processes: its edges to and from the host become
    hand-overs inside one process, its other edges start or end at the host."""
    guest = plan[component]
    # The host takes over the guest's turns on shared devices (it holds the guest's model now).
    comps = tuple(replace(c, host=host, shares_devices=False, offload=False) if c.name == component else
                  replace(c, shares_devices=c.shares_devices or guest.shares_devices,
                          offload=c.offload or guest.offload) if c.name == host else c
                  for c in plan.components)
    edges = []
    for e in plan.edges:
        source = host if e.source == component else e.source
        target = host if e.target == component else e.target
        transport = "in-process" if source == target else e.transport
        edges.append(replace(e, source=source, target=target, transport=transport,
                             consumers=plan[target].world_size))
    return replace(plan, components=comps, edges=tuple(edges))


def _place(plan: Plan, placement: str, layout: NodeLayout) -> Plan:
    """``plan`` on the devices of ``placement`` (each edge's consumers follow its receiving group's ranks)."""
    placed = parse_placement(placement, layout, tuple(c.name for c in plan.components))
    comps = tuple(replace(c, placement=placed[c.name]) for c in plan.components)
    edges = tuple(replace(e, consumers=placed[e.target].world_size) if e.consumers else e for e in plan.edges)
    return replace(plan, placement=placement, components=comps, edges=edges)


def _stages(plan: Plan, stages: int) -> Plan:
    return replace(plan, settings={**plan.settings, "pipeline_stages": stages})


def _threads(plan: Plan, component: str, threads: int) -> Plan:
    return replace(plan, components=tuple(replace(c, threads=threads) if c.name == component else c
                                          for c in plan.components))


class _Recording:
    """The run's own executor, with every launch it is asked for recorded: (group names, placements, specs)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.launches = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def launch(self, names, placements, specs, log_dir, trace_dir=None):
        self.launches.append((dict(names), {c: placements[c] for c in specs}, dict(specs)))
        return self.inner.launch(names, placements, specs, log_dir, trace_dir)


def test_the_executor_starts_exactly_the_groups_the_edited_plan_object_names(tmp_path, monkeypatch):
    import m2flow.driver.scaffold as scaffold

    made: list[_Recording] = []
    real = scaffold.make_executor
    monkeypatch.setattr(scaffold, "make_executor", lambda *a: made.append(_Recording(real(*a))) or made[-1])
    cfg = toy_config(tmp_path, placement="local", pipeline_stages=1, total_env_steps=512,
                     rollout={"fuse_with_env": False}, cluster={"cpu_devices_per_node": 2})
    before = copy.deepcopy(cfg)
    layout = NodeLayout((2,))
    asked = EMBODIED.plan(cfg, layout)
    assert asked.launched == ("env", "rollout", "actor") and asked["actor"].threads == 1
    # In memory only: the policy into the env processes, the actor alone on device 1 with two threads, two stages.
    plan = _threads(_stages(_fuse(_place(asked, "env,rollout: 0, actor: 1", layout), "rollout", "env"), 2), "actor", 2)
    plan = replace(plan, executor="local")  # still the local executor, now on two device slots
    with Run(EMBODIED, cfg, plan=plan) as run:
        (names, placements, specs), = made[0].launches  # one launch, of every group at once
        assert set(specs) == set(plan.launched) == {"env", "actor"}  # no rollout group: the plan fused it
        assert placements == {c: plan[c].placement for c in plan.launched} and names["actor"] == run.flow.names["actor"]
        assert {c: s.threads for c, s in specs.items()} == {"env": 1, "actor": 2}
        assert set(specs["env"].kwargs["hosted"]) == {"rollout"} and "hosted" not in specs["actor"].kwargs
        assert specs["env"].kwargs["settings"].env.num_groups == 2  # the plan's stages, in the env ranks' settings
        assert run.flow.actor.contexts[0].devices == (1,) and run.flow.env.contexts[0].devices == (0,)
        result = run.train()
    assert len(result.history) == 1 and result.plan is plan
    assert cfg == before  # no config key was touched on the way


def test_a_fusion_and_a_pipeline_depth_set_on_the_plan_object_run_as_set(tmp_path):
    cfg = toy_config(tmp_path, placement="local", pipeline_stages=1, total_env_steps=512,
                     rollout={"fuse_with_env": False})
    asked = EMBODIED.plan(cfg, NodeLayout((1,)))
    assert not asked.fused("rollout") and asked.settings["pipeline_stages"] == 1
    plan = _stages(_fuse(asked, "rollout", "env"), 2)
    with Run(EMBODIED, cfg, plan=plan) as run:
        assert run.plan is plan  # the object given, not a plan made again from the config
        assert plan.launched == ("env", "actor") and run.flow.rollout is None  # no rollout group of its own
        env = run.flow.env.workers[0]
        assert env.vec.num_groups == 2  # two stages on the env rank: the plan's, the config says one
        assert env.hosted("rollout") is not None  # the policy runs inside the env process: the plan's fusion
        result = run.train()
    assert len(result.history) == 1 and result.plan is plan
    assert Plan.load(tmp_path / "run" / "plan.json") == plan


@pytest.mark.slow
@pytest.mark.ray
def test_a_placement_set_on_the_plan_object_is_where_the_executor_starts_the_ranks(tmp_path):
    from tests.ray_session import shared_cluster

    cfg = toy_config(tmp_path, placement="env,rollout,actor: 0", total_env_steps=2 * 512,
                     cluster={"cpu_devices_per_node": 2})
    layout = NodeLayout((2,))
    asked = EMBODIED.plan(cfg, layout)
    assert asked["env"].world_size == 1
    plan = _place(asked, "env,rollout: 0-1, actor: 0", layout)
    with Run(EMBODIED, cfg, shared_cluster(), plan=plan) as run:
        assert run.flow.env.world_size == 2 and run.plan["env"].placement.devices == {(0, 0), (0, 1)}
        result = run.train()
    # Two env ranks of 8 envs x 64 steps: 1024 env steps an iteration, where the config's one rank makes 512.
    assert len(result.history) == 1 and result.history[-1]["env/total_steps"] == 2 * 512
