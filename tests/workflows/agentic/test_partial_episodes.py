"""Partial rollouts of the agentic workflow on the local executor: every task instance trained once or still
carried, carried episodes spanning two weight versions, the staleness restart, checkpoints, bad configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.autoplan.entry import train
from m2flow.driver.run import Run
from m2flow.runtime.waiting import gather
from m2flow.workflows.agentic.workflow import WORKFLOW
from tests.workflows.agentic.setup import tiny_config

PARTIAL = {"rollout.partial": True, "env.fuse_with_rollout": True, "algorithm.max_staleness": 1,
           "env.name": "test_turns", "env.kwargs": {"spread": 4}, "rollout.max_turns": 4, "rollout.max_tokens": 80}
"""Groups of 1, 2, 3 and 4 turns by seed (``test_turns``): the short ones finish first, the long ones carry."""


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """One tiny model directory shared by the module's runs (built by the first)."""
    return tmp_path_factory.mktemp("agentic_partial") / "model"


def _run(cfg):
    """Train; the history, the groups the actor took (iteration, slot, seed, trained), the groups the rollout
    handed out (iteration, slot, seed, versions) and the seeds it still carries."""
    with Run(WORKFLOW, cfg) as run:
        history = run.train().history
        taken = [g for part in gather([run.flow.actor.received_groups()])[0] for g in part]
        handed = gather([run.flow.rollout.handed_groups()])[0][0]
        carried = gather([run.flow.rollout.carried_seeds()])[0][0]
    return history, taken, handed, carried


ASYNC = {"env.fuse_with_rollout": False, "env.concurrent": True, "env.async_steps": True,
         "env.kwargs": {"spread": 4, "step_s": 0.001, "slow_s": 0.25, "slow_every": 3}}
"""Env workers apart whose steps answer as they come; every third seed's steps are slow (0.25 s)."""


@pytest.mark.parametrize("setting", [{"env.fuse_with_rollout": True}, {"env.fuse_with_rollout": False}, ASYNC],
                         ids=["env-in-rollout", "env-workers", "env-workers-async-steps"])
def test_every_task_instance_is_trained_once_or_still_carried(tmp_path, model, setting):
    # Fused, the rollout runs the turn loop over its own environments; apart, the flow runs it over the rollout
    # rank and an env worker, which keeps the carried episodes' environments between iterations (with async
    # steps, and the steps still out, too).
    steps, groups = 5, 2
    cfg = tiny_config(tmp_path, model, steps=steps, **{**PARTIAL, **setting})
    history, taken, handed, carried = _run(cfg)
    seeds = [seed for _, _, seed, _ in taken]
    assert len(seeds) == len(set(seeds)) == steps * groups  # never twice
    assert sorted(taken) == sorted((s, g, seed, True) for s, g, seed, _ in handed)
    assert sorted(s for s, g, _, _ in taken) == sorted(s for s in range(steps) for _ in range(groups))
    # every instance taken from the data (one batch more than trained) is trained or still carried: none lost
    assert sorted(seeds + carried) == list(range((steps + 1) * groups))
    assert all(h["rollout/partial_carried_count"] == groups for h in history)
    if setting is ASYNC:  # the slow steps of seed 0's one-turn group held up that group only: it was overtaken
        assert seeds[0] != 0 and 0 in seeds + carried
        return
    assert sum(h["rollout/partial_resumed_count"] for h in history) > 0
    # the short groups of a batch are handed out in it, before the long ones of earlier batches finish
    assert seeds[:2] == [0, 1]


def test_a_carried_episode_spans_two_weight_versions_and_none_is_too_old_or_started_over(tmp_path, model):
    history, taken, handed, _ = _run(tiny_config(tmp_path, model, steps=4, **PARTIAL))
    spans = [(step, versions) for step, _, _, versions in handed if len(versions) > 1]
    assert spans and all(versions == (step - 1, step) for step, versions in spans)
    # staleness 1: no trained token older than its iteration - 1; a carried group that could not be trained later
    # is waited for in the iteration it is due, not started over
    assert all(min(versions) >= step - 1 for step, _, _, versions in handed)
    assert sum(h["rollout/partial_restarted_count"] for h in history) == 0
    assert all(h["async/staleness_mean"] <= 1 for h in history if "async/staleness_mean" in h)


def test_a_resumed_run_plays_the_carried_instances_again_and_loses_none(tmp_path, model):
    _, whole, _, _ = _run(tiny_config(tmp_path / "whole", model, steps=4, checkpoint_every=2, **PARTIAL))
    middle = sorted((tmp_path / "whole" / "run" / "checkpoints").glob("step_*"))[0]
    cfg = tiny_config(tmp_path / "resumed", model, steps=4, checkpoint_every=2, resume=str(middle), **PARTIAL)
    history, taken, _, carried = _run(cfg)
    # the checkpoint after iteration 1 held the two carried task instances: played again from their resets
    assert len(history) == 2 and history[0]["rollout/partial_restarted_count"] == 2
    before = [seed for step, _, seed, _ in whole if step < 2]
    after = [seed for _, _, seed, _ in taken]
    # seeds 0-9 (five batches: one more than the four iterations train): each trained once, or still carried
    assert sorted(before + after + carried) == list(range(10))


@pytest.mark.parametrize("overrides, needs", [
    ({"algorithm.max_staleness": 0}, "max_staleness >= 1"),
    ({"algorithm.max_staleness": 0, "env.fuse_with_rollout": False}, "old_logprobs 'rollout'"),
])
def test_partial_without_what_it_needs_is_one_clear_error(tmp_path, overrides, needs):
    with pytest.raises(ValueError, match="rollout.partial") as e:
        tiny_config(tmp_path, **{**PARTIAL, **overrides})
    assert needs in str(e.value)


def test_async_steps_without_partial_rollouts_play_the_same_episodes_in_more_rounds(tmp_path, model):
    # Each episode's turns are sampled from its own seed, so the rounds it shares do not change what it plays:
    # async steps change when an episode's turn is played, not what it writes.
    whole = {**PARTIAL, "rollout.partial": False, "algorithm.max_staleness": 0, "env.fuse_with_rollout": False,
             "env.concurrent": True, "env.kwargs": ASYNC["env.kwargs"]}
    runs = {on: _run(tiny_config(tmp_path / str(on), model, steps=3, **{**whole, "env.async_steps": on}))
            for on in (False, True)}
    (sync, sync_taken, _, _), (overlap, overlap_taken, _, _) = runs[False], runs[True]
    assert sorted(sync_taken) == sorted(overlap_taken) and len(sync_taken) == 6
    assert [h["rollout/model_tokens"] for h in sync] == [h["rollout/model_tokens"] for h in overlap]
    assert sum(h["rollout/rounds"] for h in overlap) > sum(h["rollout/rounds"] for h in sync)


def test_async_steps_need_concurrent_steps_and_a_step_limit(tmp_path):
    with pytest.raises(ValueError, match="env.async_steps: needs concurrent"):
        tiny_config(tmp_path, **{"env.async_steps": True})
    with pytest.raises(ValueError, match="async_steps: needs a step_timeout_s"):
        tiny_config(tmp_path, **{"env.async_steps": True, "env.concurrent": True, "env.step_timeout_s": None})
