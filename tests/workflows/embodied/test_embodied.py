"""The embodied workflow end to end: every placement learns, resume is exact, bad configs fail early."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from m2flow.planner import Plan
from m2flow.planner.plan import PLAN_FILE
from m2flow.config.errors import ConfigError
from m2flow.driver.registry import load_workflow_config
from m2flow.autoplan.entry import train
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
from m2flow.workflows.embodied.config import EmbodiedConfig
from tests.workflows.embodied.setup import EXAMPLES, LEARNING, toy_config

# The module's runs start worker processes (most of their time); on a loaded machine that can take
# minutes, more than the suite's default per-test limit.
pytestmark = pytest.mark.timeout(900)

PLANS = {
    # name: (placement, pipeline stages, expected mode, env+rollout fused)
    "collocated": ("env,rollout,actor: 0", 1, "collocated", True),
    "disaggregated": ("env: 0, rollout: 1, actor: 2", 2, "disaggregated", False),
    "hybrid": ("env: 0, rollout: 1, actor: 0-1", 2, "hybrid", False),  # two actor ranks, compiled steps
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One short run per plan on the shared cluster (each run starts its own worker processes,
    which is most of its time: the runs are shared by the tests below)."""
    from tests.ray_session import shared_cluster

    cluster = shared_cluster()
    out = {}
    for name, (placement, stages, _, _) in PLANS.items():
        cfg = toy_config(tmp_path_factory.mktemp(name), placement=placement, pipeline_stages=stages,
                         trace=name == "hybrid", checkpoint_every=4 if name == "collocated" else 0,
                         **{"actor.compile": name == "hybrid"})
        out[name] = (cfg, train(EMBODIED, cfg, cluster=cluster))
    return out


@pytest.mark.learning
@pytest.mark.parametrize("name", list(PLANS))
def test_every_plan_learns(runs, name):
    cfg, result = runs[name]
    _, _, mode, fused = PLANS[name]
    assert (result.mode, result.plan.fused("rollout")) == (mode, fused)
    returns = [h["env/episode_return"] for h in result.history]
    assert len(returns) == 6
    assert returns[0] < 1.0  # about a third: the random policy
    assert returns[-1] > 1.5, returns  # at least 4-5x the random policy's return
    assert result.history[-1]["env/total_steps"] == 6 * 512


@pytest.mark.learning
def test_one_and_two_pipeline_stages_learn_alike(runs):
    # Both with one actor rank; K = 1 fused in one process, K = 2 pipelined across two.
    k1 = [h["env/episode_return"] for h in runs["collocated"][1].history]
    k2 = [h["env/episode_return"] for h in runs["disaggregated"][1].history]
    # The same algorithm on different action noise: the curves agree within a loose band.
    assert abs(sum(k1[-2:]) / 2 - sum(k2[-2:]) / 2) < 2.5, (k1, k2)


def test_metrics_and_trace_are_written(runs):
    cfg, result = runs["hybrid"]
    run_dir = Path(cfg.run_dir)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    for key in ("env/episode_return", "actor/approx_kl", "time/env_steps_per_s", "time/env_busy_s",
                "time/rollout_busy_s", "time/actor_busy_s", "critic/value_loss"):
        assert key in lines[-1], key
    assert all(line["actor/compiled"] == 1.0 for line in lines)  # actor.compile: every update ran compiled
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"env_step", "act", "train", "step"} <= names
    # The actor's wait for trajectories is a wait span inside its train call, not training time.
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    waits = [e for e in spans if e["name"] == "wait_trajectories"]
    ranks = {e["pid"] for e in waits}
    assert len(waits) == len(ranks) * len(result.history) and all(e["cat"] == "wait_channel" for e in waits)
    for w in waits:
        assert any(t["name"] == "train" and t["pid"] == w["pid"] and t["tid"] == w["tid"]
                   and t["ts"] <= w["ts"] and w["ts"] + w["dur"] <= t["ts"] + t["dur"] + 1 for t in spans)
    episodes = json.loads((run_dir / "episodes.json").read_text())
    assert len(episodes) == sum(h["env/episodes"] for h in result.history)
    plan = Plan.load(run_dir / PLAN_FILE)  # the plan the run applied, saved beside its metrics
    assert plan.workflow == "embodied" and plan.mode == result.mode and plan.placement == cfg.placement


def test_resume_continues_exactly(runs, cluster, tmp_path):
    cfg, full = runs["collocated"]
    checkpoint = Path(cfg.run_dir) / "checkpoints" / "step_000004"
    resumed = train(EMBODIED, toy_config(tmp_path, resume=str(checkpoint)), cluster=cluster)
    assert len(resumed.history) == 2
    for a, b in zip(full.history[4:], resumed.history):
        for key in LEARNING:
            assert a.get(key) == b.get(key), key
    assert resumed.episodes == full.episodes


def test_resume_in_place_after_a_crash_logs_no_step_twice(runs, cluster, tmp_path):
    """A run that died after its last iteration but before its last checkpoint, resumed with resume=auto."""
    cfg, full = runs["collocated"]
    crashed = toy_config(tmp_path, resume="auto", checkpoint_every=4)
    shutil.copytree(cfg.run_dir, crashed.run_dir)
    shutil.rmtree(Path(crashed.run_dir) / "checkpoints" / "step_000006")  # the final checkpoint never landed
    resumed = train(EMBODIED, crashed, cluster=cluster)
    assert len(resumed.history) == 2
    rows = [json.loads(x) for x in (Path(crashed.run_dir) / "metrics.jsonl").read_text().splitlines()]
    original = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in original]  # every step once, in order
    for got, want in zip(rows, original):
        assert {k: got.get(k) for k in LEARNING} == {k: want.get(k) for k in LEARNING}


@pytest.mark.learning
def test_a_checkpoint_is_evaluated_on_its_own(runs):
    from m2flow.workflows.embodied.evaluation import evaluate_checkpoint

    _, full = runs["collocated"]
    metrics = evaluate_checkpoint(full.last_checkpoint, episodes=4, overrides=["env.num_envs=2"])
    assert metrics["eval/episodes"] == 4.0
    assert metrics["eval/return"] > 1.0  # the trained policy, acting greedily



@pytest.mark.learning
def test_m2flow_eval_dispatches_on_an_embodied_checkpoint(runs, tmp_path, capsys):
    from m2flow.cli import main

    _, full = runs["collocated"]
    out = tmp_path / "eval.json"
    code = main(["eval", "--episodes", "3", "--output", str(out), str(full.last_checkpoint), "env.num_envs=2"])
    assert code == 0
    results = json.loads(out.read_text())
    assert results["eval/episodes"] == 3.0 and results["eval/return"] > 1.0
    assert f"mean return {results['eval/return']:.2f}" in capsys.readouterr().out
    assert main(["eval", "--config", "x.yaml", str(full.last_checkpoint)]) == 1  # reasoning-only option

@pytest.mark.parametrize(("override", "key", "words"), [
    ({"env.env_id": "HalfCheetah-v9"}, "env_id", "HalfCheetah-v5"),
    ({"placement": "env: 0, rollout: 1, critic: 2"}, "placement", "unknown component"),
    ({"placement": "env: 0, rollout: 1-2, actor: 0"}, "placement", "rollout has 2 ranks"),
    ({"pipeline_stages": 9}, "pipeline_stages", "num_envs=8"),
    ({"env.num_groups": 2}, "num_groups", "pipeline_stages"),
    ({"env.seed": 3}, "seed", "top-level"),
    ({"algorithm.minibatch_size": 1024}, "minibatch_size", "exceeds the batch of 512"),
    ({"algorithm.epochs": 0}, "algorithm.epochs", "must be >= 1"),
    ({"env_worker.imports": ["no.such.module"]}, "imports", "cannot import"),
    ({"algorithm.advantage": "grpo"}, "use_critic", "learns no value function"),
    ({"algorithm.advantage": "grpo", "algorithm.use_critic": False, "algorithm.group_size": 1}, "group_size",
     ">= 2"),
    ({"algorithm.advantage": "grpo", "algorithm.use_critic": False}, "max_episode_steps", "whole episodes"),
    ({"algorithm.advantage": "grpo", "algorithm.use_critic": False, "env.max_episode_steps": 8,
      "algorithm.group_size": 3}, "group_size", "multiple"),
])
def test_bad_config_fails_before_anything_starts(tmp_path, override, key, words):
    with pytest.raises(ConfigError) as info:
        toy_config(tmp_path, **override)
    text = str(info.value)
    assert key in text and words in text, text


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_load(name):
    spec, cfg = load_workflow_config(EXAMPLES / name)
    assert spec.name == "embodied"
    assert cfg.placed().mode in ("collocated", "hybrid")


def test_a_traced_run_that_fails_raises_its_own_error(tmp_path, monkeypatch):
    from tests.ray_session import shared_cluster

    def fails(*args, **kwargs):
        raise RuntimeError("the run's own failure")

    monkeypatch.setattr("m2flow.workflows.embodied.flow.EmbodiedFlow", fails)
    cfg = toy_config(tmp_path, trace=True)
    with pytest.raises(RuntimeError, match="the run's own failure"):
        train(EMBODIED, cfg, cluster=shared_cluster())
    # the merge in the run's finally block only warns, into the run's log
    assert "no trace shards" in (Path(cfg.run_dir) / "driver.log").read_text()


def grpo_config(tmp_path: Path, **overrides) -> EmbodiedConfig:
    """ContextMatch under GRPO: 32 envs in groups of 4, one episode (at most 8 steps) each per iteration."""
    return toy_config(tmp_path, **{"placement": "local", "rollout_steps": 8, "total_env_steps": 40 * 256,
                                   "env.num_envs": 32, "env.max_episode_steps": 8, "algorithm.advantage": "grpo",
                                   "algorithm.use_critic": False, "algorithm.group_size": 4,
                                   "algorithm.minibatch_size": 64, **overrides})


@pytest.mark.learning
def test_grpo_learns_from_group_resets_and_trains_on_whole_episodes_only(tmp_path):
    result = train(EMBODIED, grpo_config(tmp_path))
    returns = [h["env/episode_return"] for h in result.history]
    assert returns[0] < 1.0  # about a third: the random policy
    assert min(returns[-5:]) > 6.0, returns  # near the best (8), twenty times the random policy's return
    # Early on most episodes end in a step or two: the steps after an env's first episode are not trained on.
    assert result.history[0]["actor/batch_size"] < 8 * 32
    assert all(h["actor/batch_size"] <= 8 * 32 for h in result.history)


def test_grpo_resumed_run_continues_exactly(tmp_path):
    full = train(EMBODIED, grpo_config(tmp_path / "full", total_env_steps=8 * 256, checkpoint_every=4))
    checkpoint = tmp_path / "full" / "run" / "checkpoints" / "step_000004"
    resumed = train(EMBODIED, grpo_config(tmp_path / "resumed", total_env_steps=8 * 256, resume=str(checkpoint)))
    assert len(resumed.history) == 4
    for a, b in zip(full.history[4:], resumed.history):
        for key in ("actor/pg_loss", "actor/approx_kl", "actor/batch_size", "env/episode_return", "env/episodes"):
            assert a.get(key) == b.get(key), key
