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
    from m2flow.workflows.embodied import train
    from tests.workflows.test_embodied import toy_config

    flaky = {"env.env_id": "M2flowToy/Flaky-v0", "placement": "local", "total_env_steps": 3 * 512}
    train(toy_config(tmp_path / "rare", **flaky, **{"env.env_kwargs": {"step_every": 50}}))
    rows = [json.loads(line) for line in (tmp_path / "rare" / "run" / "metrics.jsonl").read_text().splitlines()]
    # 8 envs x 64 steps an iteration: each env raises on its 50th, 100th and 150th step, one per iteration
    assert [r["env/errors_count"] for r in rows] == [8.0, 8.0, 8.0]
    try:
        train(toy_config(tmp_path / "often", **flaky, **{"env.env_kwargs": {"step_every": 5}}))
    except Exception as error:  # noqa: BLE001 - the error is what is checked
        assert health_stop(error)
        assert "env M2flowToy/Flaky-v0: 96 exceptions in 512 env steps on env rank 0 in iteration 0" in str(error)
        assert "more than env_worker.max_error_rate=0.1" in str(error)
    else:
        raise AssertionError("the run went on past env_worker.max_error_rate")
