"""The Plan of a search candidate for a graph that has no plan function of its own (synthetic workloads).

A workflow turns a ``PlanChoice`` into a Plan through its own plan function (which also validates
its config). A bare ``SearchSpace`` (the scale benchmark, the tests' hand-made graphs) has none; this
builds the Plan the same way from the graph alone: the choice's placement resolved to ranks, each
fusion it takes applied where component and host sit on the same devices rank for rank, its setting
values over the space's settings, and the process groups that hold a model (their own, or one fused
into them) taking turns where they share devices with another such group, and offloading unless the
space says that model does not. The Plan is validated against the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from m2flow.planner.choice import PlanChoice
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.plan import ComponentPlan, Plan
from m2flow.planner.setup import state_owners
from m2flow.runtime.placement import NodeLayout, executor_kind, parse_placement


def plan_of(graph: WorkflowGraph, running: Sequence[str], settings: Mapping[str, Any], choice: PlanChoice,
            layout: NodeLayout, threads: Mapping[str, int] | None = None,
            offload: Mapping[str, bool] | None = None) -> Plan:
    """The validated Plan of ``choice`` (``settings``: the plan settings it leaves as they are). A placement
    that cannot be met raises PlacementError."""
    placement = choice.placement
    placed = parse_placement(placement, layout, graph.component_names)
    hosts = {c: c for c in graph.component_names}
    for c, h in choice.fusions:
        if c in running and h in running and placed[c].same_devices(placed[hosts[h]]):
            hosts[c] = hosts[h]
    for c in hosts:  # a chain of fusions ends at a group of its own
        while hosts[hosts[c]] != hosts[c]:
            hosts[c] = hosts[hosts[c]]
    active = {c: hosts[c] for c in running}
    holders = [c for c in running if graph.component(c).holds_model]
    moved = state_owners(active, holders)
    groups = [g for g, m in moved.items() if m]

    def shares(g: str) -> bool:
        return g in groups and any(placed[g].devices & placed[o].devices for o in groups if o != g)

    components = tuple(
        ComponentPlan(c, placed[c], hosts[c], active=c in running, shares_devices=hosts[c] == c and shares(c),
                      offload=hosts[c] == c and shares(c) and all((offload or {}).get(m, True) for m in moved.get(c, ())),
                      threads=(threads or {}).get(c, 1))
        for c in graph.component_names)
    return Plan(graph.name, executor_kind(placement), placement, components, (),
                {**settings, **choice.values}).validate(graph)
