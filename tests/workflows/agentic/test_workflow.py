"""The agentic workflow's plan: how far its rollout plays ahead (one iteration less with partial rollouts), what
the flow and the simulator both read, and the notes that say how partial rollouts are priced."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.driver.registry import load_workflow_config
from m2flow.planner.bound import FastBound
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.setup import setup_from_plan
from m2flow.planner.simulate import Simulator
from m2flow.runtime.placement import NodeLayout
from m2flow.workflows.agentic.graph import GRAPH
from m2flow.workflows.agentic.workflow import WORKFLOW, WORKLOAD

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "agentic" / "calculator_grpo.yaml"

# A turn of all 32 episodes: the rollout 0.1 s, the env 0.01 s; training them 1 s; messages and syncs free.
COST = CostModel({"env": ComponentCost(a=0.01), "rollout": ComponentCost(a=0.1), "actor": ComponentCost(a=1.0)},
                 link=Link(latency=0.0, local_latency=0.0, dispatch=0.0))


def _plan(staleness: int, partial: bool):
    overrides = [f"algorithm.max_staleness={staleness}", f"rollout.partial={str(partial).lower()}",
                 "placement=env,rollout: 0, actor: 1", "cluster.cpu_devices_per_node=2"]
    spec, cfg = load_workflow_config(CONFIG, overrides)
    return WORKFLOW.plan(cfg, NodeLayout((2,)))


@pytest.mark.parametrize("staleness,partial,ahead", [(0, False, 0), (1, False, 1), (1, True, 0), (2, True, 1)])
def test_the_plan_runs_ahead_by_the_staleness_bound_one_less_with_partial_rollouts(staleness, partial, ahead):
    plan = _plan(staleness, partial)
    assert plan.settings["run_ahead"] == ahead
    notes = [n for n in plan.notes if n.startswith("rollout.partial")]
    if partial:
        assert any(f"generates {ahead} iteration(s) ahead, not {staleness}" in n for n in notes)
        assert any("priced as the profile measured it" in n for n in notes)
    else:
        assert not notes


@pytest.mark.parametrize("staleness,partial,seconds", [(0, False, 1.33), (1, False, 1.0), (1, True, 1.33),
                                                       (2, True, 1.0)])
def test_playing_ahead_overlaps_the_turns_with_training(staleness, partial, seconds):
    # Three turns (max_turns) of rollout 0.1 s and env 0.01 s, then training 1 s: 1.33 s an iteration in step;
    # one iteration ahead, the next iteration's turns overlap this one's training, which sets the pace: 1 s.
    plan = _plan(staleness, partial)
    setup = setup_from_plan(plan, ("rollout", "actor"))
    assert Simulator(GRAPH, WORKLOAD, COST).simulate(setup).iteration_time == pytest.approx(seconds)
    # The search's bound drops what running ahead overlaps, and stays below the simulation.
    bound, _ = FastBound(GRAPH, WORKLOAD, COST, setup).evaluate({c: p.ranks for c, p in setup.components.items()})
    assert bound <= seconds + 1e-9
    if plan.settings["run_ahead"]:
        assert bound == pytest.approx(1.0)  # the training, which the turns of the next iteration overlap
