"""Each workflow has an example of ``algorithm.max_staleness`` where it pays: the actor on a device of its
own, so generation (or collection) of iteration k + 1 overlaps training on k; the plan says so."""

from __future__ import annotations

import pytest

from m2flow.runtime.cluster import expected_layout
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING
from m2flow.driver.registry import load_workflow_config

EXAMPLES = {
    "reasoning": "examples/reasoning/arithmetic_grpo_staleness.yaml",
    "embodied": "examples/embodied/halfcheetah_staleness.yaml",
}


@pytest.mark.parametrize("workflow", sorted(EXAMPLES))
def test_the_staleness_example_gives_the_actor_devices_of_its_own(workflow):
    spec, cfg = load_workflow_config(EXAMPLES[workflow])
    assert spec.name == workflow and cfg.algorithm.max_staleness == 1
    plan = (REASONING if workflow == "reasoning" else EMBODIED).plan(cfg, expected_layout(cfg.cluster))
    assert plan.settings["max_staleness"] == 1 and plan.mode == "hybrid"
    producer = "rollout" if workflow == "reasoning" else "env"
    devices = {name: {(r.node_rank, d) for r in plan[name].placement.ranks for d in r.local_devices}
               for name in ("actor", producer)}
    assert devices["actor"] and not devices["actor"] & devices[producer], devices
