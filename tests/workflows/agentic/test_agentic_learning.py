"""The agentic workflow learns, and ``placement: auto`` profiles, searches and runs it."""

from __future__ import annotations

import json

import pytest

from m2flow.autoplan.entry import train
from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC
from tests.workflows.agentic.setup import tiny_config


@pytest.mark.learning
def test_guess_the_number_reward_rises(tmp_path):
    # Guess 1-4 in 4 turns: a random tiny model rarely writes a digit; GRPO teaches it to guess. Sixteen
    # groups a step keep the climb steady: over seeds 0-4 under the default and AVX2 float paths the
    # rise measured 0.19-0.28 (docs/user_guide.md, Testing); with eight groups over 30 steps it ranged
    # 0.09-0.35, the float path alone moving one seed from 0.09 to 0.19.
    cfg = tiny_config(tmp_path, steps=20, **{"episodes.groups_per_step": 16, "episodes.group_size": 4,
                                             "env.kwargs": {"high": 4, "max_turns": 4}, "actor.optim": {"lr": 0.01},
                                             "actor.micro_batch_size": 32})
    rewards = [h["reward/mean"] for h in train(AGENTIC, cfg).history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, rewards


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_placement_auto_profiles_searches_and_runs_the_agentic_workflow(tmp_path):
    from tests.ray_session import shared_cluster

    cfg = tiny_config(tmp_path, steps=2, placement="auto", cluster={"cpu_devices_per_node": 2},
                      auto={"profile_iterations": 2})
    result = train(AGENTIC, cfg, cluster=shared_cluster())
    record = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert record["runs_with"]["placement"] == result.plan.placement  # the plan it chose is the plan that ran
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert set(profile["components"]) >= {"env", "rollout", "actor"}
    assert len(result.history) == 2
    # The fusion it chose (env inside the rollout's processes or not) is the one that ran.
    assert result.plan.fused("env") == bool(record["runs_with"].get("env.fuse_with_rollout", False))


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_calculator_rl_after_the_warm_start_raises_held_out_accuracy(tmp_path):
    # The example as shipped, shortened to 20 iterations: warm start on the imperfect teacher, then GRPO with
    # the calculator tool; held-out accuracy (sampled at temperature 1, 200 fresh problems) before and after
    # (seed 0 in docs/agentic.md: 0.52 -> 0.71 at 20 iterations, 0.525 at 10).
    from m2flow.driver.registry import load_workflow_config

    _, cfg = load_workflow_config("examples/agentic/calculator_grpo.yaml", [
        "placement=local", f"run_dir={tmp_path}/run", f"model.path={tmp_path}/model", "steps=20", "eval_every=20",
        "metrics.sinks=[jsonl]", "model.warm_start.threads=1"])
    result = train(AGENTIC, cfg)
    (_, before), (_, after) = result.evaluations
    assert after["eval/return_mean"] > before["eval/return_mean"] + 0.1, result.evaluations
    assert after["eval/tool_calls"] > before["eval/tool_calls"]


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_guess_the_number_rl_after_the_warm_start_raises_the_win_rate_and_cuts_turns(tmp_path):
    # The example as shipped, shortened to 20 iterations: warm start on the imperfect guessing teacher, then
    # GRPO; 200 held-out episodes sampled at temperature 1 (seed 0 in docs/agentic.md: 0.625 -> 0.765 wins,
    # 3.06 -> 2.85 turns).
    from m2flow.driver.registry import load_workflow_config

    _, cfg = load_workflow_config("examples/agentic/guess_number_grpo.yaml", [
        "placement=local", f"run_dir={tmp_path}/run", f"model.path={tmp_path}/model", "steps=20", "eval_every=20",
        "metrics.sinks=[jsonl]", "model.warm_start.threads=1"])
    result = train(AGENTIC, cfg)
    (_, before), (_, after) = result.evaluations
    assert after["eval/success"] > before["eval/success"] + 0.08, result.evaluations
    assert after["eval/turns_mean"] < before["eval/turns_mean"] - 0.1, result.evaluations
