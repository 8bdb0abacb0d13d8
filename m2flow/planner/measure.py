"""From what a run measured to cost points: how many calls of which size a plan makes per iteration.

A run reports, per iteration, the seconds each component was busy (its timing metric). The cost
model prices one *call*; ``call_shapes`` says, for a plan as the simulator sees it, how many calls
of how many items each component makes in one iteration (the chain: one per micro-batch; the
loop: one per step of each pipeline stage), so ``points`` turns busy seconds into the
``[items, devices, seconds]`` points a profile holds. Only plans whose calls are all of one size
give points (a smaller last micro-batch would blur them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from m2flow.planner.cost import CostModel
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.setup import SimSetup, Workload
from m2flow.planner.simulate import Simulator


@dataclass(frozen=True)
class CallShape:
    """The calls one component makes in an iteration."""

    items: float
    """items of every call (all ranks together: the ``b`` of the cost curve)"""
    devices: int
    """its ranks: the ``d`` of the cost curve"""
    calls: int
    """calls per iteration"""
    uniform: bool = True
    """every call has ``items`` items (False: the last micro-batch is smaller)"""


def call_shapes(graph: WorkflowGraph, workload: Workload, setup: SimSetup) -> dict[str, CallShape]:
    """Per running component of the workload, the calls it makes in one iteration under ``setup``."""
    sim = Simulator(graph, workload, CostModel({}))
    items, micro, n_micro = sim.sizes(setup)
    out: dict[str, CallShape] = {}
    for c in workload.chain:
        if c in setup.components:
            uniform = math.isclose(items, micro * n_micro, rel_tol=1e-9)
            out[c] = CallShape(micro, setup.components[c].ranks, n_micro, uniform)
    if workload.loop and all(c in setup.components for c in workload.loop):
        stages, steps, per_stage = sim.loop_sizes(setup)
        for c in workload.loop:
            out[c] = CallShape(per_stage, setup.components[c].ranks, stages * steps)
    return out


def points(shapes: Mapping[str, CallShape], busy: Mapping[str, float]) -> dict[str, tuple[float, int, float]]:
    """``[items, devices, seconds per call]`` of each component with a uniform shape and a busy time > 0."""
    out = {}
    for c, shape in shapes.items():
        seconds = busy.get(c)
        if shape.uniform and seconds is not None and seconds > 0 and shape.calls > 0:
            out[c] = (shape.items, shape.devices, seconds / shape.calls)
    return out
