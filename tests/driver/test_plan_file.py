"""The Plan saved in ``plan.json`` is what runs: a run given a plan file applies its decisions (devices,
fusions, pipeline stages, micro-batch sizes) over what its config says, and a bad plan file is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m2flow.config import from_dict
from m2flow.driver.run import Run
from m2flow.planner import Plan, PlanError
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING
from tests.workflows.reasoning.setup import toy_config as reasoning_config
from tests.workflows.embodied.setup import toy_config as embodied_config


def _edit(plan_json: Path, out: Path, **settings) -> Path:
    data = json.loads(plan_json.read_text())
    data["settings"].update(settings)
    out.write_text(json.dumps(data))
    return out


def test_pipeline_stages_come_from_the_plan_not_the_config(tmp_path):
    cfg = embodied_config(tmp_path / "a", placement="local", pipeline_stages=1, total_env_steps=512)
    with Run(EMBODIED, cfg) as run:
        assert run.flow.env.workers[0].vec.num_groups == 1
        run.train()
    edited = _edit(tmp_path / "a" / "run" / "plan.json", tmp_path / "plan.json", pipeline_stages=2)
    again = embodied_config(tmp_path / "b", placement="local", pipeline_stages=1, total_env_steps=512,
                            plan_file=str(edited))
    with Run(EMBODIED, again) as run:
        assert run.plan.settings["pipeline_stages"] == 2
        assert run.flow.env.workers[0].vec.num_groups == 2  # the env rank runs two stages: the plan's
        result = run.train()
    assert len(result.history) == 1
    assert Plan.load(tmp_path / "b" / "run" / "plan.json").settings["pipeline_stages"] == 2


def test_micro_batch_sizes_come_from_the_plan_not_the_config(tmp_path):
    cfg = reasoning_config(tmp_path / "a", "local", steps=1)
    with Run(REASONING, cfg) as run:
        assert run.plan.settings["actor_micro_batch"] == 16
        assert run.flow.actor.workers[0].micro_batch_size == 16
    edited = _edit(tmp_path / "a" / "run" / "plan.json", tmp_path / "plan.json", actor_micro_batch=8)
    again = reasoning_config(tmp_path / "b", "local", steps=1, plan_file=str(edited))
    with Run(REASONING, again) as run:
        assert run.flow.actor.workers[0].micro_batch_size == 8
        assert run.flow.actor.workers[0].groups_per_micro_batch == 1  # 8 responses: one group of 8
        assert len(run.train().history) == 1


def test_a_plan_file_for_another_workflow_or_a_broken_one_is_refused(tmp_path):
    cfg = embodied_config(tmp_path / "a", placement="local", total_env_steps=512)
    with Run(EMBODIED, cfg):
        pass
    plan = tmp_path / "a" / "run" / "plan.json"
    with pytest.raises(PlanError, match="workflow 'embodied'"):
        Run(REASONING, from_dict(ReasoningConfig, {"plan_file": str(plan), "run_dir": str(tmp_path / "r")}))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(PlanError, match="broken.json"):
        Run(EMBODIED, embodied_config(tmp_path / "c", plan_file=str(broken)))
    with pytest.raises(PlanError, match="does not exist"):
        Run(EMBODIED, embodied_config(tmp_path / "d", plan_file=str(tmp_path / "missing.json")))
