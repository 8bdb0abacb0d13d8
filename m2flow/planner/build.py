"""The one Plan builder: a ``PlanChoice`` on a workflow's graph, under the rules its config adds.

Every Plan is built here, from the graph's declarations alone: a workflow's ``plan`` (its config's
choice, or a candidate of the search), and a bare search space's candidate. The builder decides, the
same way for every workflow:

- the devices of every rank (the choice's placement resolved against the cluster's layout);
- which components run: all but those the rules say this config does not need;
- which fusions are taken: those the choice asks for, between running components, that ``fusion_refusal``
  allows (``plan.fusion_refusal``: the component on its host's devices rank for rank, decided there alone) and the
  rules do not refuse; a fusion into a fused component lands in that one's host;
- who takes turns on shared devices: the process groups that hold a model (their own, or one fused
  into them) and share a device with another such group; they offload unless the rules say the model
  they hold does not;
- what each edge becomes: inside one process a hand-over (``in-process``; a weight sync there is
  ``unused``: the hosted part uses its host's model), between groups a ``channel`` (a stream) or
  point-to-point messages; an edge into a component that does not run goes on to where that
  component's stream goes, an edge out of one is ``unused``;
- the settings and notes the rules derive from that structure (a workflow's defaults and checks).

A workflow adds constraints through ``PlanRules`` and never builds a component's part by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from m2flow.planner.choice import PlanChoice
from m2flow.planner.graph import DRIVER, WorkflowGraph
from m2flow.planner.plan import ComponentPlan, EdgePlan, Plan, fusion_refusal
from m2flow.planner.setup import state_owners
from m2flow.runtime.placement import ComponentPlacement, NodeLayout, executor_kind, parse_placement

SettingsRule = Callable[[Plan], tuple[Mapping[str, Any], Sequence[str]]]


@dataclass(frozen=True)
class PlanRules:
    """What a config adds to its workflow's graph when a Plan is built: the workflow's constraints."""

    inactive: Mapping[str, str] = field(default_factory=dict)
    """optional component -> why it does not run under this config (a note of the plan)"""
    refused: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(component, host) -> why this config cannot take that fusion, besides the devices (a note)"""
    threads: Mapping[str, int] = field(default_factory=dict)
    """component -> torch threads per rank (missing: 1)"""
    offload: Mapping[str, bool] = field(default_factory=dict)
    """model holder -> whether its group offloads when it shares devices (missing: it does)"""
    settings: SettingsRule | None = None
    """``settings(plan)``: the plan's settings and further notes, given its structure (devices, fusions, who
    runs); it raises ValueError to refuse the plan. None: no settings"""


def build_plan(graph: WorkflowGraph, choice: PlanChoice, layout: NodeLayout, rules: PlanRules = PlanRules()) -> Plan:
    """The validated Plan of ``choice`` on ``graph`` under ``rules``. A placement that cannot be met raises
    PlacementError; a plan the rules refuse, ValueError (PlanError)."""
    names = graph.component_names
    placed = parse_placement(choice.placement, layout, names)
    running = [c for c in names if c not in rules.inactive]
    notes = [rules.inactive[c] for c in names if c in rules.inactive]
    hosts = {c: c for c in names}
    for f in graph.fusions:
        if not choice.fused(f.component, f.host) or f.component not in running or f.host not in running:
            continue
        why = (fusion_refusal(placed[f.component], placed[hosts[f.host]], f.component, f.host)
               or rules.refused.get((f.component, f.host), ""))
        if why:
            notes.append(why)
        else:
            hosts[f.component] = f.host
    for c in names:  # a chain of fusions ends at a group of its own
        while hosts[hosts[c]] != hosts[c]:
            hosts[c] = hosts[hosts[c]]
    # Per process group, the models its offload moves: its own, or those of the holders fused into it.
    owners = state_owners({c: hosts[c] for c in running}, [c for c in running if graph.component(c).holds_model])
    models = [g for g, held in owners.items() if held]

    def shares(c: str) -> bool:
        return c in models and any(placed[c].devices & placed[o].devices for o in models if o != c)

    components = tuple(
        ComponentPlan(c, placed[c], hosts[c], active=c in running, shares_devices=shares(c),
                      offload=shares(c) and all(rules.offload.get(m, True) for m in owners.get(c, ())),
                      threads=rules.threads.get(c, 1))
        for c in names)
    structure = Plan(graph.name, executor_kind(choice.placement), choice.placement, components,
                     _edges(graph, hosts, set(running), placed), {}, tuple(notes))
    settings, more = rules.settings(structure) if rules.settings is not None else ({}, ())
    return replace(structure, settings=dict(settings), notes=(*notes, *more)).validate(graph)


def _edges(graph: WorkflowGraph, hosts: Mapping[str, str], running: set[str],
           placed: Mapping[str, ComponentPlacement]) -> tuple[EdgePlan, ...]:
    """What each edge of the graph becomes, given the groups the fusions leave and who runs."""

    def onward(target: str) -> str:
        # Items sent to a component that does not run go where its own stream would have taken them.
        while target != DRIVER and target not in running:
            nxt = [e.target for e in graph.edges if e.source == target and e.kind == "stream"]
            if len(nxt) != 1:
                return target
            target = nxt[0]
        return target

    out = []
    for e in graph.edges:
        target = onward(e.target)
        src = DRIVER if e.source == DRIVER else hosts[e.source]
        dst = DRIVER if target == DRIVER else hosts[target]
        if ((e.source != DRIVER and e.source not in running) or (target != DRIVER and target not in running)
                or (src == dst and e.kind == "weights")):
            out.append(EdgePlan(e.name, e.source, e.target, "unused", 0))  # as the graph declares it
        elif src == dst:
            out.append(EdgePlan(e.name, src, dst, "in-process", placed[dst].world_size))
        else:
            out.append(EdgePlan(e.name, src, dst, "channel" if e.kind == "stream" else "p2p",
                                placed[dst].world_size if dst != DRIVER else 1))
    return tuple(out)
