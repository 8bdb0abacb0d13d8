"""The Plan of a search candidate for a graph that has no workflow behind it (synthetic workloads).

A workflow builds a ``PlanChoice``'s Plan with the constraints its config adds (``Workflow.plan``). A
bare ``SearchSpace`` (the scale benchmark, the tests' hand-made graphs) has none but the space's own:
the components that run, their threads, which models offload, and the plan settings the choice does not
vary. Both go through the one builder, ``build.build_plan``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from m2flow.planner.build import PlanRules, build_plan
from m2flow.planner.choice import PlanChoice
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.plan import Plan
from m2flow.runtime.placement import NodeLayout


def plan_of(graph: WorkflowGraph, running: Sequence[str], settings: Mapping[str, Any], choice: PlanChoice,
            layout: NodeLayout, threads: Mapping[str, int] | None = None,
            offload: Mapping[str, bool] | None = None) -> Plan:
    """The validated Plan of ``choice`` (``settings``: the plan settings it leaves as they are). A placement
    that cannot be met raises PlacementError."""
    rules = PlanRules(inactive={c: f"{c} does not run" for c in graph.component_names if c not in running},
                      threads=dict(threads or {}), offload=dict(offload or {}),
                      settings=lambda plan: ({**settings, **choice.values}, ()))
    return build_plan(graph, choice, layout, rules)
