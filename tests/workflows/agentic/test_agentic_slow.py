"""The agentic workflow learns, and ``placement: auto`` profiles, searches and runs it."""

from __future__ import annotations

import json

import pytest

from m2flow.workflows.agentic.workflow import train
from tests.workflows.agentic.setup import tiny_config


def test_guess_the_number_reward_rises(tmp_path):
    # Guess 1-4 in 4 turns: a random tiny model rarely writes a digit; GRPO teaches it to guess.
    cfg = tiny_config(tmp_path, steps=30, **{"episodes.groups_per_step": 8, "episodes.group_size": 4,
                                             "env.kwargs": {"high": 4, "max_turns": 4}, "actor.optim": {"lr": 0.01},
                                             "actor.micro_batch_size": 32})
    rewards = [h["reward/mean"] for h in train(cfg).history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, rewards


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_placement_auto_profiles_searches_and_runs_the_agentic_workflow(tmp_path):
    from tests.ray_session import shared_cluster

    cfg = tiny_config(tmp_path, steps=2, placement="auto", cluster={"cpu_devices_per_node": 2},
                      auto={"profile_iterations": 2})
    result = train(cfg, cluster=shared_cluster())
    record = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert record["runs_with"]["placement"] == result.plan.placement  # the plan it chose is the plan that ran
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert set(profile["components"]) >= {"env", "rollout", "actor"}
    assert len(result.history) == 2
    # The fusion it chose (env inside the rollout's processes or not) is the one that ran.
    assert result.plan.fused("env") == bool(record["runs_with"].get("env.fuse_with_rollout", False))
