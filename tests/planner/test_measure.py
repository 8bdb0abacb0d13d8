"""Busy seconds per iteration -> cost points: the calls each component makes under a plan."""

from __future__ import annotations

import pytest

from m2flow.planner.cost import fit_component
from m2flow.planner.measure import call_shapes, points
from m2flow.planner.setup import build_setup
from m2flow.workflows.embodied.graph import GRAPH as EMBODIED
from m2flow.workflows.embodied.plan import WORKLOAD as EMBODIED_W
from m2flow.workflows.reasoning.graph import GRAPH as REASONING
from m2flow.workflows.reasoning.plan import WORKLOAD as REASONING_W


def _reasoning(prompts: int, chunk: int, ranks: int = 1):
    settings = {"prompts_per_step": prompts, "group_size": 4, "prompts_per_chunk": chunk}
    return build_setup([(("rollout", "reward", "actor"), 0, ranks)], {}, settings, holders=("rollout", "actor"))


def test_chain_calls_are_one_per_micro_batch() -> None:
    shapes = call_shapes(REASONING, REASONING_W, _reasoning(8, 2, ranks=2))
    assert shapes["rollout"].items == 8 and shapes["rollout"].calls == 4 and shapes["rollout"].devices == 2
    assert set(shapes) == {"rollout", "reward", "actor"}  # inference does not run here
    uneven = call_shapes(REASONING, REASONING_W, _reasoning(6, 4))
    assert not uneven["actor"].uniform  # 16 + 8 responses: the last call is smaller
    assert "actor" not in points(uneven, {"actor": 1.0})


def test_loop_calls_are_one_per_stage_step() -> None:
    settings = {"pipeline_stages": 2, "rollout_steps": 16, "envs_per_rank": 8}
    setup = build_setup([(("env", "rollout"), 0, 2), (("actor",), 2, 1)], {}, settings, holders=("rollout", "actor"))
    shapes = call_shapes(EMBODIED, EMBODIED_W, setup)
    # 2 env ranks x 8 envs in 2 stages: 8 envs per call, 2 x 16 calls per iteration.
    assert (shapes["env"].items, shapes["env"].devices, shapes["env"].calls) == (8, 2, 32)
    assert (shapes["actor"].items, shapes["actor"].calls) == (2 * 8 * 16, 1)
    pts = points(shapes, {"env": 3.2, "actor": 0.5, "rollout": 0.0})
    assert pts["env"] == pytest.approx((8, 2, 0.1)) and "rollout" not in pts


def test_points_of_a_known_curve_fit_back_to_it() -> None:
    a, c = 0.03, 0.002
    pts = []
    for prompts in (2, 4, 8):
        shapes = call_shapes(REASONING, REASONING_W, _reasoning(prompts, prompts))
        items = shapes["rollout"].items
        pts.append(points(shapes, {"rollout": a + c * items})["rollout"])
    fit = fit_component(pts)
    assert fit.error < 1e-9 and fit.cost.a == pytest.approx(a) and fit.cost.c == pytest.approx(c)
