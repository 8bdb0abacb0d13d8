"""Workflow graphs and execution plans: what a workflow is made of, and every decision of how it runs.

Pure Python, no Ray: a graph is data a workflow declares once; a ``Plan`` is built from the graph,
the config and the cluster's layout (by the workflow's planning function), printed, saved as JSON
and applied by an executor.
"""

from m2flow.planner.graph import Component, Edge, Fusion, WorkflowGraph
from m2flow.planner.plan import ComponentPlan, EdgePlan, Plan, PlanError

__all__ = ["Component", "ComponentPlan", "Edge", "EdgePlan", "Fusion", "Plan", "PlanError", "WorkflowGraph"]
