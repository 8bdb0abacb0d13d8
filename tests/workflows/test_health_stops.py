"""A run whose rewards, losses or envs keep failing stops with one `error:` line naming the limit."""

from __future__ import annotations

from m2flow.cli import main

EXAMPLE = "examples/reasoning/arithmetic_grpo.yaml"


def test_a_reward_failing_past_its_error_rate_stops_the_run_with_one_line(tmp_path, capsys):
    code = main(["train", EXAMPLE, "placement=local", "steps=2", "model.warm_start.steps=0", "model.warm_start.source=answers",
                 "reward.fn=tests.rewards.reward_fns:raising_reward", f"model.path={tmp_path}/model",
                 f"run_dir={tmp_path}/run", "metrics.sinks=[jsonl]"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1
    assert err[-1].startswith("error: ") and "reward checks failed in iteration 0 (0 timed out" in err[-1], err
    assert "more than reward.max_error_rate=0.1" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert sum(line.startswith("error: ") for line in err) == 1


def test_an_env_that_raises_now_and_then_is_counted_and_one_that_raises_often_stops_the_run(tmp_path):
    import json

    from m2flow.runtime.errors import health_stop
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from tests.workflows.embodied.setup import toy_config

    flaky = {"env.env_id": "M2flowToy/Flaky-v0", "placement": "local", "total_env_steps": 3 * 512}
    train(EMBODIED, toy_config(tmp_path / "rare", **flaky, **{"env.env_kwargs": {"step_every": 50}}))
    rows = [json.loads(line) for line in (tmp_path / "rare" / "run" / "metrics.jsonl").read_text().splitlines()]
    # 8 envs x 64 steps an iteration: each env raises on its 50th, 100th and 150th step, one per iteration
    assert [r["env/errors_count"] for r in rows] == [8.0, 8.0, 8.0]
    try:
        train(EMBODIED, toy_config(tmp_path / "often", **flaky, **{"env.env_kwargs": {"step_every": 5}}))
    except Exception as error:  # noqa: BLE001 - the error is what is checked
        assert health_stop(error)
        assert "env M2flowToy/Flaky-v0: 96 exceptions in 512 env steps on env rank 0 in iteration 0" in str(error)
        assert "more than env_worker.max_error_rate=0.1" in str(error)
    else:
        raise AssertionError("the run went on past env_worker.max_error_rate")


def test_the_count_of_skipped_updates_in_a_row_survives_a_resume(tmp_path, monkeypatch):
    """Every loss NaN, at most 3 skips in a row: 2 before the checkpoint, so the first resumed one is the third."""
    import json

    import pytest

    import m2flow.workers.actor as actor_module
    from m2flow.runtime.errors import health_stop
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING
    from m2flow.driver.checkpoints import TRAINER_STATE
    from tests.workflows.reasoning.setup import toy_config

    original = actor_module.policy_objective

    def nan_objective(*args, **kwargs):
        obj = original(*args, **kwargs)
        obj.loss = obj.loss * float("nan")
        return obj

    monkeypatch.setattr(actor_module, "policy_objective", nan_objective)  # placement local: the actor is here
    cfg = {"actor": {"max_skipped_updates": 3, "micro_batch_size": 16}, "checkpoint_every": 2}
    first = train(REASONING, toy_config(tmp_path, "local", steps=2, **cfg))
    assert [h["actor/skipped_updates_count"] for h in first.history] == [1.0, 1.0]
    checkpoint = first.last_checkpoint
    assert json.loads((checkpoint / TRAINER_STATE).read_text())["flow"]["actor"] == {"skipped_in_row": 2}
    with pytest.raises(Exception) as caught:
        train(REASONING, toy_config(tmp_path, "local", steps=4, resume=str(checkpoint), **cfg))
    assert health_stop(caught.value) and "3 optimizer steps in a row skipped" in str(caught.value)


def test_the_count_of_skipped_ppo_updates_in_a_row_survives_a_resume(tmp_path, monkeypatch):
    """The embodied counterpart: every PPO update sees a NaN return, at most 3 skips in a row."""
    import json

    import pytest

    from m2flow.runtime.errors import health_stop
    from m2flow.workers.embodied.ppo import PPOUpdater
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from m2flow.driver.checkpoints import TRAINER_STATE
    from tests.workflows.embodied.setup import toy_config

    original = PPOUpdater.update

    def poisoned(self, batch, lr=None, **kwargs):
        batch.returns[0] = float("nan")  # the value loss turns NaN
        return original(self, batch, lr, **kwargs)

    monkeypatch.setattr(PPOUpdater, "update", poisoned)  # placement local: the actor is here
    cfg = {"placement": "local", "checkpoint_every": 2, "actor.max_skipped_updates": 3}
    first = train(EMBODIED, toy_config(tmp_path / "a", total_env_steps=2 * 512, **cfg))
    assert [h["actor/skipped_updates_count"] for h in first.history] == [1.0, 1.0]
    checkpoint = first.last_checkpoint
    assert json.loads((checkpoint / TRAINER_STATE).read_text())["flow"]["actor"] == {"skipped_in_row": 2}
    with pytest.raises(Exception) as caught:
        train(EMBODIED, toy_config(tmp_path / "b", total_env_steps=4 * 512, resume=str(checkpoint), **cfg))
    assert health_stop(caught.value) and "3 PPO updates in a row skipped" in str(caught.value)
