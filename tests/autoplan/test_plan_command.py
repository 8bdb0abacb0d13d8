"""`m2flow plan show` for both workflows in every mode: devices, fusions and stages in the table; JSON loads back equal."""

from __future__ import annotations

import json

import pytest

from m2flow.cli import main
from m2flow.planner import Plan
from m2flow.runtime.placement import NodeLayout

REASONING = "examples/reasoning/arithmetic_grpo.yaml"
EMBODIED = "examples/embodied/cartpole_pipelined.yaml"


def _show(capsys, *args: str) -> str:
    assert main(["plan", "show", *args]) == 0
    return capsys.readouterr().out


def _rows(out: str) -> dict[str, str]:
    """The plan table's component rows, by component."""
    lines = out[out.index("plan: workflow"):].splitlines()
    return {line.split()[0]: line for line in lines[2:] if line.startswith("  ") and not line.startswith("   ")
            and line.split()[0] not in ("edges:", "settings:", "note:")}


@pytest.mark.parametrize("placement, mode, expect", [
    ("actor,rollout,reward,inference: 0", "collocated",
     {"rollout": "actor (fused)", "reward": "actor (fused)", "actor": "own group"}),
    ("rollout: 0-1, reward: 2, inference: 3, actor: 4-5", "disaggregated",
     {"rollout": "0:0 0:1", "reward": "0:2", "actor": "0:4 0:5"}),
    ("rollout,reward: 0-1, actor,inference: 0-3", "hybrid",
     {"reward": "rollout (fused)", "actor": "0:0 0:1 0:2 0:3"}),
])
def test_reasoning_plans(capsys, placement, mode, expect):
    out = _show(capsys, REASONING, f"placement={json.dumps(placement)}", "algorithm.old_logprobs=inference")
    assert "workflow reasoning: components" in out  # the graph comes first
    header = out[out.index("plan: workflow"):].splitlines()[0]
    assert f"reasoning, {mode}, executor ray" in header
    rows = _rows(out)
    assert set(rows) == {"rollout", "reward", "inference", "actor"}
    for component, words in expect.items():
        assert words in rows[component], rows[component]
    assert "prompts_per_chunk=" in out  # the granularity decision is shown


@pytest.mark.parametrize("placement, stages, mode, expect", [
    ("env,rollout,actor: 0", 1, "collocated", {"rollout": "env (fused)", "env": "own group"}),
    ("env: 0-1, rollout: 2, actor: 3", 2, "disaggregated", {"rollout": "own group", "env": "0:0 0:1"}),
    ("env: 0, rollout: 1, actor: 0", 2, "hybrid", {"rollout": "0:1", "actor": "0:0"}),
])
def test_embodied_plans(capsys, placement, stages, mode, expect):
    out = _show(capsys, EMBODIED, f"placement={json.dumps(placement)}", f"pipeline_stages={stages}",
                "cluster.cpu_devices_per_node=4")
    header = out[out.index("plan: workflow"):].splitlines()[0]
    assert f"embodied, {mode}, executor ray" in header
    rows = _rows(out)
    for component, words in expect.items():
        assert words in rows[component], rows[component]
    assert f"pipeline_stages={stages}" in out
    fused = "fused" in rows["rollout"]
    assert ("observations: env -> env, in-process" in out) == fused


@pytest.mark.parametrize("config", [REASONING, EMBODIED])
def test_the_json_plan_loads_back_equal(capsys, config):
    out = _show(capsys, config, "--json")
    plan = Plan.from_json(out)
    from m2flow.driver.registry import load_workflow_config

    spec, cfg = load_workflow_config(config)
    assert plan == spec.plan(cfg, NodeLayout((cfg.cluster.cpu_devices_per_node,)))


@pytest.mark.parametrize("config", [REASONING, EMBODIED])
def test_local_placement_plans_the_local_executor(capsys, config):
    out = _show(capsys, config, "placement=local")
    header = out[out.index("plan: workflow"):].splitlines()[0]
    assert "collocated, executor local" in header


def test_a_placement_that_does_not_fit_is_one_error_line(capsys):
    assert main(["plan", "show", EMBODIED, "placement=env: 0-99, rollout,actor: 0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "placement" in err[0]
