"""A run whose rewards, losses or envs keep failing stops with one `error:` line naming the limit."""

from __future__ import annotations

from m2flow.cli import main

EXAMPLE = "examples/reasoning/arithmetic_grpo.yaml"


def test_a_reward_failing_past_its_error_rate_stops_the_run_with_one_line(tmp_path, capsys):
    code = main(["train", EXAMPLE, "placement=local", "steps=2", "model.warm_start_steps=0",
                 "reward.fn=tests.rewards.reward_fns:raising_reward", f"model.path={tmp_path}/model",
                 f"run_dir={tmp_path}/run", "metrics.sinks=[jsonl]"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1
    assert err[-1].startswith("error: ") and "reward checks failed in iteration 0 (0 timed out" in err[-1], err
    assert "more than reward.max_error_rate=0.1" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert sum(line.startswith("error: ") for line in err) == 1
