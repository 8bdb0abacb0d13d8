"""``m2flow eval`` on an agentic checkpoint: the run's own held-out evaluation of the saved policy, in this
process; and what the command refuses for it."""

from __future__ import annotations

import json

import pytest

from m2flow.autoplan.entry import train
from m2flow.cli import main
from m2flow.workflows.agentic.workflow import WORKFLOW
from tests.workflows.agentic.setup import tiny_config

EVAL_KEYS = {"eval/return_mean", "eval/success", "eval/turns_mean", "eval/tool_calls"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two iterations on the local executor from a short warm start (so episodes differ: some win, some run out
    of turns), evaluated before training and after the last iteration, sampled (so every turn's seed counts),
    and checkpointed."""
    root = tmp_path_factory.mktemp("agentic-eval")
    result = train(WORKFLOW, tiny_config(root, steps=2, eval_every=2, checkpoint_every=2, eval_episodes=8,
                                         **{"rollout.eval_temperature": 1.0, "model.warm_start.steps": 40,
                                            "model.warm_start.batch_size": 16, "model.warm_start.threads": 1}))
    return result


def test_eval_of_a_checkpoint_is_the_runs_own_held_out_evaluation_at_its_step(run, tmp_path, capsys):
    checkpoint = run.last_checkpoint
    assert checkpoint.name == "step_000002"
    logged = dict(run.evaluations)[2]  # the evaluation after iteration 1, of the weights step_000002 holds
    out = tmp_path / "eval.json"
    assert main(["eval", "--output", str(out), str(checkpoint)]) == 0
    results = json.loads(out.read_text())
    assert set(results) == EVAL_KEYS
    # The same episodes (seeds, env settings, budgets, each turn's sampling seed) of the same float32 weights
    # through the same function: the same numbers, to the bit.
    assert results == {k: logged[k] for k in EVAL_KEYS}
    assert 0 < results["eval/success"] < 1  # episodes that differ, not a degenerate policy
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{checkpoint}: mean return {results['eval/return_mean']:.3f}")
    assert "over 8 held-out episodes (guess_number)" in line


def test_episodes_and_overrides_of_the_run_config_reach_the_evaluation(run, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--episodes", "2", "--output", str(out), str(run.last_checkpoint), "rollout.max_turns=1"]) == 0
    results = json.loads(out.read_text())
    assert results["eval/turns_mean"] == 1.0  # every episode cut after its one model turn
    assert "over 2 held-out episodes" in capsys.readouterr().out


@pytest.mark.parametrize("args, words", [
    (["--config", "x.yaml"], "--config is for reasoning checkpoints; this agentic checkpoint carries its own config"),
    (["--episodes", "0"], "--episodes must be >= 1, got 0"),
    (["rollout.max_turns=0"], "rollout.max_turns: must be >= 1, got 0"),
])
def test_bad_input_to_eval_of_an_agentic_checkpoint_is_one_error_line(run, capsys, args, words):
    code = main(["eval", *args, str(run.last_checkpoint)] if args[0].startswith("--")
                else ["eval", str(run.last_checkpoint), *args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code in (1, 2) and len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
