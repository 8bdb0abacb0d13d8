"""``metrics.unknown_prefix: error`` holds for the project's own metrics: tiny local runs of every
workflow (with a critic, with bounded staleness, with partial rollouts, with evaluation and checkpoints) log only names
under known prefixes, so a strict run ends with exit 0."""

from __future__ import annotations

import json

import pytest

from m2flow.cli import main
from m2flow.metrics import KNOWN_PREFIXES, prefix_of

pytestmark = pytest.mark.timeout(300)

REASONING = ["placement=local", "model.warm_start.steps=0", "model.warm_start.source=answers",
             "model.tiny.hidden_size=32", "data.prompts_per_step=4", "eval_size=8"]

CASES = {
    "grpo-staleness": ["examples/reasoning/arithmetic_grpo.yaml", *REASONING, "steps=3", "eval_every=2",
                       "checkpoint_every=2", "algorithm.max_staleness=1", "algorithm.old_logprobs=rollout"],
    "grpo-partial": ["examples/reasoning/arithmetic_grpo.yaml", *REASONING, "steps=3", "eval_every=2",
                     "checkpoint_every=2", "algorithm.max_staleness=1", "algorithm.old_logprobs=rollout",
                     "rollout.backend=lean", "rollout.partial=true"],
    "ppo-critic": ["examples/reasoning/arithmetic_ppo.yaml", *REASONING, "steps=2", "eval_every=2"],
    "embodied-staleness": ["examples/embodied/cartpole_pipelined.yaml", "placement=local", "total_env_steps=3072",
                           "eval_every=2", "eval_episodes=1", "checkpoint_every=2", "trace=false",
                           "algorithm.max_staleness=1"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_strict_run_passes_and_logs_only_known_groups(tmp_path, capsys, case):
    args = [*CASES[case], f"run_dir={tmp_path}/run", f"model.path={tmp_path}/model", "metrics.sinks=[jsonl]",
            "metrics.unknown_prefix=error"]
    if case.startswith("embodied"):
        args.remove(f"model.path={tmp_path}/model")
    assert main(["train", *args]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    names = {k for row in rows for k in row if k not in ("step", "time")}
    assert "faults/restarts" in names  # the run loop's own counter, the name a strict run used to refuse
    assert any(n.startswith("eval/") for n in names)
    assert {prefix_of(n) for n in names} <= set(KNOWN_PREFIXES)
