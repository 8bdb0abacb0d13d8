"""The reasoning workflow with bounded staleness: the schedule, the plan, exact equality with the
synchronous flow where nothing may run ahead, stale groups never trained, every group trained once,
and resume that loses and duplicates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from m2flow.cli import main
from m2flow.config import ConfigError, from_dict
from m2flow.runtime.placement import NodeLayout
from m2flow.driver.run import Run
from m2flow.workflows.reasoning.workflow import WORKFLOW
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.driver.checkpoints import CHECKPOINTS
from tests.workflows.reasoning.setup import improved, toy_config

pytestmark = pytest.mark.timeout(900)

DEMO = str(Path(__file__).resolve().parents[3] / "m2flow" / "workflows" / "reasoning/demo.yaml")
# What a run learns and how it scores; time, rates and the staleness counts themselves are left out.
LEARNING = ("reward/mean", "rollout/response_length", "rollout/tokens_count", "actor/pg_loss", "actor/grad_norm",
            "actor/approx_kl", "actor/clip_frac", "actor/ratio_mean")


def _config(root: Path, staleness: int, placement: str = "local", **overrides) -> ReasoningConfig:
    """The tiny GRPO run with behaviour log-probs from inference and a rollout group of its own."""
    algorithm = {"max_staleness": staleness, "old_logprobs": "inference", **overrides.pop("algorithm", {})}
    rollout = {"fuse_with_actor": False, **overrides.pop("rollout", {})}
    return toy_config(root, placement, algorithm=algorithm, rollout=rollout, **overrides)


def _run(cfg: ReasoningConfig, cluster=None, patch=None):
    """Train ``cfg``; returns (history, the groups the actor took per rank, the last checkpoint's weights)."""
    with Run(WORKFLOW, cfg, cluster) as run:
        if patch is not None:
            patch(run.flow)
        result = run.train()
        received = run.flow.actor.received_groups().wait()
    weights = load_file(result.last_checkpoint / "actor" / "model.safetensors") if result.last_checkpoint else None
    return result.history, received, weights


def _learning(history):
    return [{k: h[k] for k in LEARNING if k in h} for h in history]


def _taken(received) -> list[tuple[int, int]]:
    return sorted((step, slot) for rank in received for step, slot, _, _ in rank)


# ----------------------------------------------------------------------------- config and plan


@pytest.mark.parametrize("data,message", [
    ({"algorithm": {"max_staleness": -1}}, "algorithm.max_staleness: must be >= 0, got -1"),
    ({"algorithm": {"max_staleness": 1, "old_logprobs": "actor"}}, "needs the behaviour policy's log-probs"),
    ({"algorithm": {"max_staleness": 1}, "actor": {"mini_batches": 2}}, "one optimizer step per iteration"),
])
def test_impossible_staleness_settings_fail_naming_the_key(data, message):
    with pytest.raises(ConfigError) as info:
        from_dict(ReasoningConfig, data)
    assert message in str(info.value) and str(info.value).startswith("algorithm")


def test_the_plan_records_the_staleness_and_what_overlaps(tmp_path):
    layout = NodeLayout((8,))
    sync = WORKFLOW.plan(toy_config(tmp_path, "actor,rollout,inference,reward: 0"), layout)
    assert sync.settings["max_staleness"] == 0 and sync.fused("rollout")
    assert not any("max_staleness" in n for n in sync.notes)
    # Collocated: the rollout cannot run ahead inside the actor's process, so it gets a group of its
    # own, and the plan says that its compute only takes turns with training.
    turns = WORKFLOW.plan(_config(tmp_path, 1, "actor,rollout,inference,reward: 0",
                                   rollout={"fuse_with_actor": True}), layout)
    assert turns.settings["max_staleness"] == 1 and not turns.fused("rollout") and "rollout" in turns.launched
    assert any("cannot do inside the actor's processes" in n for n in turns.notes)
    assert any("take turns under the device lock" in n for n in turns.notes)
    apart = WORKFLOW.plan(_config(tmp_path, 2, "rollout,reward: 0, inference: 1, actor: 2"), layout)
    assert apart.settings["max_staleness"] == 2
    assert any("k+1..k+2 generate" in n and "generation and training overlap" in n for n in apart.notes)
    assert "max_staleness=2" in apart.table()


def test_plan_show_prints_the_staleness(capsys):
    overrides = ["algorithm.max_staleness=1", "algorithm.old_logprobs=inference",
                 "placement=rollout,reward: 0, inference,actor: 1", "cluster.cpu_devices_per_node=2"]
    assert main(["plan", "show", DEMO, *overrides]) == 0
    out = capsys.readouterr().out
    assert "max_staleness=1" in out and "iteration k+1 generates while the actor trains on k" in out


# ----------------------------------------------------------------------------- the schedule


# ----------------------------------------------------------------------------- whole runs (in process)


def test_staleness_that_may_never_run_ahead_equals_the_synchronous_flow(tmp_path):
    # Evaluating before every iteration drains the pipeline every iteration: with staleness 1 every
    # generation then uses the newest weights, and the run must equal the synchronous one exactly.
    runs = {s: _run(_config(tmp_path / f"s{s}", s, steps=4, eval_every=1, checkpoint_every=4)) for s in (0, 1)}
    (sync, sync_received, sync_weights), (drained, drained_received, drained_weights) = runs[0], runs[1]
    assert _learning(sync) == _learning(drained)
    assert [h["eval/accuracy"] for h in sync] == [h["eval/accuracy"] for h in drained]
    assert all(h["async/staleness_max"] == 0.0 and h["async/age_0_samples"] == 64.0 for h in drained)
    assert all("async/staleness_max" not in h for h in sync)
    assert sync_received == drained_received
    assert sync_weights.keys() == drained_weights.keys()
    assert all(torch.equal(sync_weights[k], drained_weights[k]) for k in sync_weights)


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("stale1")
    cfg = _config(root, 1, steps=6, checkpoint_every=3)
    return root, _run(cfg)


def test_staleness_1_trains_every_group_once_with_the_weights_one_iteration_old(stale_run):
    _, (history, received, _) = stale_run
    assert _taken(received) == [(s, k) for s in range(6) for k in range(8)]
    assert all(trained for rank in received for *_, trained in rank)
    # Iteration 0 and the one after the checkpoint start from the newest weights; the others one behind.
    assert [h["async/staleness_max"] for h in history] == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert all(h["async/age_0_samples"] + h["async/age_1_samples"] == 64.0 for h in history)
    assert all(h["async/dropped_samples"] == 0.0 for h in history)
    assert all(h["async/importance_weight_mean"] > 0 for h in history)
    assert all(h["rollout/responses_count"] == 64 for h in history)
    assert all("time/actor_wait_s" in h for h in history) and all("time/rollout_wait_s" in h for h in history[1:])


def test_staleness_1_resumes_exactly(stale_run, tmp_path):
    root, (history, _, weights) = stale_run
    checkpoint = root / "run" / CHECKPOINTS / "step_000003"
    cfg = _config(root, 1, steps=6, checkpoint_every=3, run_dir=str(tmp_path / "resumed"), resume=str(checkpoint))
    resumed, received, resumed_weights = _run(cfg)
    assert len(resumed) == 3
    assert _learning(resumed) == _learning(history[3:])
    for key in ("async/age_0_samples", "async/age_1_samples", "async/staleness_max"):
        assert [h[key] for h in resumed] == [h[key] for h in history[3:]], key
    # nothing lost, nothing twice: the resumed run trains exactly the iterations after the checkpoint
    assert _taken(received) == [(s, k) for s in range(3, 6) for k in range(8)]
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)


def test_a_group_older_than_the_bound_is_counted_and_never_trained(tmp_path):
    # The weights of version 1 never reach the rollout (nor inference): iteration 2 is generated by
    # version 0, two versions behind the actor, which drops it whole and makes no update.
    def skip_version_1(flow):
        sync = flow.sync_weights
        flow.sync_weights = lambda version=None: [] if version == 1 else sync(version)

    history, received, _ = _run(_config(tmp_path, 1, steps=4), patch=skip_version_1)
    assert [h["async/dropped_samples"] for h in history] == [0.0, 0.0, 64.0, 0.0]
    assert history[2]["async/age_0_samples"] + history[2]["async/age_1_samples"] == 0.0
    assert history[2]["actor/skipped_steps_count"] == 1.0
    (groups,) = received
    assert sorted((s, k) for s, k, _, _ in groups) == [(s, k) for s in range(4) for k in range(8)]
    assert all(trained == (step != 2) for step, _, _, trained in groups)


# ----------------------------------------------------------------------------- on Ray, overlapping


@pytest.mark.learning
def test_disaggregated_staleness_2_with_two_rollout_ranks_trains_every_group_once(cluster, tmp_path):
    # Two rollout ranks feed one actor rank: a fast rank's groups of iteration k + 1 must not be taken
    # for iteration k (each iteration has a lane of its own in the streams).
    cfg = _config(tmp_path, 2, "rollout,reward: 0-1, inference: 2, actor: 3", steps=6, rollout={"prompts_per_chunk": 2})
    history, received, _ = _run(cfg, cluster)
    assert _taken(received) == [(s, k) for s in range(6) for k in range(8)]
    assert all(trained for rank in received for *_, trained in rank)
    assert [h["async/staleness_max"] for h in history] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert all(h["async/dropped_samples"] == 0.0 for h in history)
    assert improved(history), [h["reward/mean"] for h in history]


def test_collocated_staleness_1_takes_turns_and_trains_every_group_once(cluster, tmp_path):
    # One device for everything, one process per component: generation ahead takes turns with
    # training under the device lock (no deadlock with groups of two iterations in flight).
    cfg = _config(tmp_path, 1, "actor,rollout,inference,reward: 0", steps=4, rollout={"prompts_per_chunk": 4})
    history, received, _ = _run(cfg, cluster)
    assert _taken(received) == [(s, k) for s in range(4) for k in range(8)]
    assert all(trained for rank in received for *_, trained in rank)
    assert [h["async/staleness_max"] for h in history] == [0.0, 1.0, 1.0, 1.0]


def test_behaviour_log_probs_reported_by_the_rollout_serve_as_well(tmp_path):
    # No inference workers: the generator's own log-probs are the behaviour policy's.
    history, received, _ = _run(_config(tmp_path, 1, steps=3, algorithm={"old_logprobs": "rollout"}))
    assert _taken(received) == [(s, k) for s in range(3) for k in range(8)]
    assert [h["async/staleness_max"] for h in history] == [0.0, 1.0, 1.0]
    assert all(0.5 < h["async/importance_weight_mean"] < 2.0 for h in history)
