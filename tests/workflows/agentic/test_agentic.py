"""The agentic workflow on the local executor: every trajectory streamed once, with the environments in
env workers or in the rollout, resume continues exactly, staleness, misbehaving environments counted or stopping the run, examples and plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.cli import main
from m2flow.driver.registry import load_workflow_config
from m2flow.runtime.waiting import gather
from m2flow.driver.run import Run
from m2flow.autoplan.entry import train
from m2flow.workflows.agentic.workflow import WORKFLOW
from tests.workflows.agentic.setup import ENVS, comparable, tiny_config

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "agentic").glob("*.yaml"))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """One tiny model directory shared by the module's runs (built by the first)."""
    return tmp_path_factory.mktemp("agentic") / "model"


def _run_and_collect(cfg) -> tuple[list[dict[str, float]], list[int], list[tuple[int, int]]]:
    """Train; the history, every trajectory id the rollout sent and every (iteration, group) the actor took."""
    with Run(WORKFLOW, cfg) as run:
        result = run.train()
        emitted = [t for part in gather([run.flow.rollout.emitted_ids()])[0] for t in part]
        taken = [(s, g) for part in gather([run.flow.actor.received_groups()])[0] for s, g, _, _ in part]
    return result.history, emitted, taken


@pytest.mark.parametrize("fused", [False, True], ids=["env-workers", "env-in-rollout"])
def test_every_trajectory_reaches_the_actor_once_and_observations_carry_no_loss(tmp_path, model, fused):
    # Apart, the flow runs the turn loop over the env workers; fused, the rollout runs it over its own
    # environments (``play_iteration``): one loop (``turn_loop.play_turns``), two places it runs.
    with Run(WORKFLOW, tiny_config(tmp_path, model, **{"env.fuse_with_rollout": fused})) as run:
        history = run.train().history
        assert run.plan.fused("env") == fused and ("env" in run.plan.launched) != fused
        emitted = [t for part in gather([run.flow.rollout.emitted_ids()])[0] for t in part]
        taken = [(s, g) for part in gather([run.flow.actor.received_groups()])[0] for s, g, _, _ in part]
    assert len(history) == 3
    assert sorted(emitted) == list(range(3 * 2 * 2)) and sorted(taken) == [(s, g) for s in range(3) for g in range(2)]
    h = history[0]
    assert h["rollout/trajectories"] == 4 and h["env/resets"] == 4 and h["env/steps"] > 0
    assert h["rollout/observation_tokens"] > 0 and h["rollout/model_tokens"] > 0  # both in the responses
    assert all(h["rollout/turns_mean"] <= 4 for h in history)
    assert all(1 <= h["rollout/rounds"] <= 4 and h["time/env_busy_s"] > 0 for h in history)
    assert "actor/pg_loss" in h and "reward/mean" in h


def test_a_resumed_run_continues_exactly(tmp_path, model):
    whole = train(WORKFLOW, tiny_config(tmp_path / "whole", model, steps=4, checkpoint_every=2))
    middle = sorted((tmp_path / "whole" / "run" / "checkpoints").glob("step_*"))[0]
    resumed = train(WORKFLOW, tiny_config(tmp_path / "resumed", model, steps=4, checkpoint_every=2, resume=str(middle)))
    assert len(resumed.history) == 2
    assert comparable(resumed.history) == comparable(whole.history[2:])


def test_bounded_staleness_plays_ahead_and_loses_nothing(tmp_path, model):
    cfg = tiny_config(tmp_path, model, **{"algorithm.max_staleness": 1})
    history, emitted, taken = _run_and_collect(cfg)
    assert sorted(emitted) == list(range(12)) and len(taken) == len(set(taken)) == 6
    assert history[1]["async/staleness_mean"] > 0  # iteration 1 was played behind the weights of iteration 0


@pytest.mark.parametrize("fault, counter", [("raise", "env/raised"), ("hang", "env/timeouts"),
                                            ("bad", "env/bad_outputs")])
def test_a_misbehaving_environment_ends_its_episode_and_is_counted(tmp_path, model, fault, counter):
    cfg = tiny_config(tmp_path, model, steps=2, **{
        "env.name": "test_faulty", "env.kwargs": {"fault": fault, "every": 2, "hang_s": 1.0, "high": 8, "max_turns": 4},
        "env.step_timeout_s": 0.2, "env.max_error_rate": 1.0, "rollout.max_turn_tokens": 2})
    history, emitted, _ = _run_and_collect(cfg)
    assert sorted(emitted) == list(range(8))  # the failed episodes are trained on as far as they went
    assert sum(h[counter] for h in history) > 0
    assert sum(h.get("rollout/finish_env_error", 0.0) for h in history) == sum(h[counter] for h in history)


def test_too_many_environment_failures_stop_the_run_with_one_error_line(tmp_path, model, capsys):
    code = main(["train", str(EXAMPLES[-1]), "placement=local", "steps=2", f"run_dir={tmp_path}/run",
                 f"model.path={model}", "metrics.sinks=[jsonl]", "episodes.groups_per_step=2", "episodes.group_size=2",
                 f"env.imports=[{ENVS}]", "env.name=test_faulty", "env.kwargs={fault: raise, every: 1, high: 8}",
                 "env.max_error_rate=0.0", "rollout.max_turn_tokens=2", "eval_every=0", "model.warm_start.steps=0"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1
    assert err[-1].startswith("error: ") and "max_error_rate=0" in err[-1] and "raised" in err[-1], err
    assert sum(line.startswith("error: ") for line in err) == 1 and not any("Traceback" in x for x in err)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_and_validate(path):
    workflow, cfg = load_workflow_config(path)
    assert workflow.name == "agentic" and cfg.steps >= 1


def test_there_are_calculator_and_guess_number_examples():
    assert {p.name for p in EXAMPLES} >= {"calculator_grpo.yaml", "guess_number_grpo.yaml"}


def test_an_unknown_environment_fails_naming_the_key():
    from m2flow.config.errors import ConfigError

    with pytest.raises(ConfigError, match="env.*unknown environment 'nope'"):
        load_workflow_config(EXAMPLES[0], ["env.name=nope"])


def test_plan_show_covers_the_agentic_graph(capsys):
    assert main(["plan", "show", str(EXAMPLES[0]), "cluster.cpu_devices_per_node=2",
                 "placement=env: 1, rollout,actor: 0"]) == 0
    out = capsys.readouterr().out
    assert "workflow agentic: components" in out and "env" in out and "trajectories" in out
    assert main(["plan", "show", str(EXAMPLES[0]), "env.fuse_with_rollout=true"]) == 0
    assert "rollout (fused)" in capsys.readouterr().out


def test_ppo_with_a_critic_trains_policy_and_value_model(tmp_path, model):
    history = train(WORKFLOW, tiny_config(tmp_path, model, steps=2, **{"algorithm.adv_estimator": "gae"})).history
    import math

    assert all(math.isfinite(h["critic/value_loss"]) and h["critic/grad_norm"] > 0 for h in history)
    assert all(math.isfinite(h["actor/pg_loss"]) for h in history)


def test_a_malformed_tool_call_is_answered_with_an_error_and_counted(tmp_path, model):
    history = train(WORKFLOW, tiny_config(tmp_path, model, steps=1, **{
        "rollout.backend": "test_malformed_caller", "rollout.max_turn_tokens": 24, "rollout.max_tokens": 96,
        "rollout.stop": ["</tool>"], "env.name": "calculator", "env.kwargs": {"digits": 2}})).history
    h = history[0]
    assert h["tool/malformed"] == 4 and h["rollout/finish_terminated"] == 4  # each: a bad call, then an answer
    assert h["reward/mean"] == 0.0 and h["env/raised"] == 0


def test_rollout_ranks_metrics_add_counts_and_weigh_means_by_trajectories():
    from m2flow.workflows.agentic.flow import merge_rollout_metrics

    merged = merge_rollout_metrics([{"rollout/trajectories": 3.0, "reward/mean": 1.0, "tool/ok": 2.0},
                                    {"rollout/trajectories": 1.0, "reward/mean": 0.0, "tool/ok": 1.0}])
    assert merged == {"rollout/trajectories": 4.0, "reward/mean": 0.75, "tool/ok": 3.0}


def test_compiled_decoding_plays_the_episodes_eager_decoding_plays(tmp_path, model, monkeypatch):
    from m2flow.models.functional_decode import CompiledDecode

    compiled_steps = []
    call = CompiledDecode.__call__

    def counting(self, *args):
        if self.active and args[0].shape[0] >= 2:
            compiled_steps.append(args[0].shape[0])
        return call(self, *args)

    eager = train(WORKFLOW, tiny_config(tmp_path / "eager", model, steps=2))
    monkeypatch.setattr(CompiledDecode, "__call__", counting)
    compiled = train(WORKFLOW, tiny_config(tmp_path / "compiled", model, steps=2, **{"rollout.compile": True}))
    assert compiled_steps, "no decoding step ran compiled"
    for got, want in zip(comparable(compiled.history), comparable(eager.history), strict=True):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_compile_on_a_backend_that_does_not_compile_fails_naming_the_key():
    from m2flow.config.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout.compile.*is an option of the 'lean' backend, not of 'hf'"):
        load_workflow_config(EXAMPLES[0], ["rollout.backend=hf", "rollout.compile=true"])
