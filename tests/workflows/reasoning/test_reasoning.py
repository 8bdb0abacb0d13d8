"""Collocated GRPO end to end: the reward improves, every group is trained once, resume is exact.

The collocated runs here use the ``local`` placement: the same plan (every component on device 0, the rollout
generating in the actor, the reward scored there) in this process. That it computes what Ray's processes
compute is ``tests/workflows/test_local_executor.py``'s claim; the Ray-only behaviours (a fused rollout on two
devices, failing stages, the processes' device lock) keep their Ray runs below and in
``test_reasoning_async.py``.
"""

from __future__ import annotations

import json
import time

import pytest

from m2flow.cli import main
from m2flow.planner import Plan
from m2flow.planner.plan import PLAN_FILE
from m2flow.driver.run import Run
from m2flow.autoplan.entry import train
from m2flow.workflows.reasoning.workflow import WORKFLOW
from m2flow.driver.checkpoints import CHECKPOINTS, TRAINER_STATE
from m2flow.runtime.waiting import gather
from m2flow.runtime import Worker, WorkerError, WorkerGroup
from m2flow.runtime.trace import iter_spans, load_trace
from tests.workflows.reasoning.setup import improved, toy_config

COLLOCATED = "local"


@pytest.fixture(scope="module")
def collocated(tmp_path_factory):
    root = tmp_path_factory.mktemp("collocated")
    cfg = toy_config(root, COLLOCATED, steps=6, checkpoint_every=3, eval_every=3)
    with Run(WORKFLOW, cfg) as run:
        result = run.train()
        received = run.flow.actor.received_groups().wait()
        assert run.flow.reward is None  # reward on rollout's device: scored in the rollout process
    return root, cfg, result, received


@pytest.mark.learning
def test_collocated_grpo_improves_the_reward(collocated):
    _, _, result, _ = collocated
    assert result.mode == "collocated"
    plan = Plan.load(result.run_dir / PLAN_FILE)
    assert "rollout" not in plan.launched and plan.fused("rollout") and plan["reward"].host == "actor"
    rewards = [h["reward/mean"] for h in result.history]
    assert len(rewards) == 6 and improved(result.history), rewards
    assert all(h["rollout/responses_count"] == 64 for h in result.history)
    # evaluated before training, after iteration 3 and after the last
    assert [step for step, _ in result.evaluations] == [0, 3, 6]
    assert "eval/accuracy" in result.history[2] and "eval/accuracy" in result.history[-1]


def test_every_group_of_every_iteration_is_trained_exactly_once(collocated):
    _, _, _, received = collocated
    (groups,) = received  # one actor rank
    assert sorted((step, slot) for step, slot, _, _ in groups) == [(s, k) for s in range(6) for k in range(8)]
    assert all(trained for *_, trained in groups)
    # Each iteration trains eight distinct prompts of the dataset.
    for s in range(6):
        assert len({index for step, _, index, _ in groups if step == s}) == 8


# One device is the two-device case with one rank (and the collocated runs above generate fused on one
# device): slow, to keep the suite's four Ray runs here to two.
@pytest.mark.parametrize("devices", [pytest.param("0", marks=pytest.mark.slow), "0-1"])
def test_a_rollout_fused_into_the_actor_generates_what_a_separate_rollout_would(tmp_path, devices):
    # Rollout and actor on the same devices rank for rank: by default each actor process generates
    # from the policy it trains, with no weight sync; with fuse_with_actor off, rollout workers get the
    # weights by sync. The same seeds must then draw the same responses and make the same updates.
    from tests.ray_session import shared_cluster

    runs = {}
    for fuse in (True, False):
        cfg = toy_config(tmp_path / f"fuse{fuse}", f"actor,rollout,inference,reward: {devices}", steps=3,
                         eval_every=2, algorithm={"old_logprobs": "actor"}, trace=True,
                         rollout={"fuse_with_actor": fuse, "prompts_per_chunk": 2})
        with Run(WORKFLOW, cfg, shared_cluster()) as run:
            result = run.train()
            assert (getattr(run.flow.rollout, "host", None) is run.flow.actor) == fuse  # generating in the actor
            received = run.flow.actor.received_groups().wait()
        syncs = [s for s in iter_spans(load_trace(result.run_dir)) if s["cat"] == "weight_sync"]
        runs[fuse] = result.history, received, len(syncs)
    (fused, fused_received, fused_syncs), (separate, separate_received, separate_syncs) = runs[True], runs[False]
    keys = ["reward/mean", "actor/grad_norm", "actor/pg_loss", "rollout/tokens_count", "rollout/response_length_max"]
    assert [{k: h[k] for k in keys} for h in fused] == [{k: h[k] for k in keys} for h in separate]
    assert fused[-1]["eval/accuracy"] == separate[-1]["eval/accuracy"]
    assert fused_received == separate_received  # the same groups on the same ranks
    assert fused_syncs == 0 and separate_syncs > 0


@pytest.mark.parametrize("fuse_reward", [True, False])
def test_without_log_probs_to_compute_scored_groups_go_straight_to_the_actor(tmp_path, fuse_reward):
    # The actor's own forward gives the old log-probs and there is no KL term: inference has nothing
    # to do, so it is not started, and every group still reaches the actor once. Reward shares the
    # rollout's device: fused, the rollout scores and sends to the actor; if not, reward workers do.
    cfg = toy_config(tmp_path, "rollout,reward,inference: 0, actor: 1", steps=2,
                     algorithm={"old_logprobs": "actor"}, rollout={"prompts_per_chunk": 4},
                     reward={"fuse_with_rollout": fuse_reward})
    from tests.ray_session import shared_cluster

    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        result = run.train()
        assert run.flow.inference is None and (run.flow.reward is None) == fuse_reward
        (groups,) = run.flow.actor.received_groups().wait()
    assert sorted((step, slot) for step, slot, _, _ in groups) == [(s, k) for s in range(2) for k in range(8)]
    assert all("time/inference" not in h and h["rollout/responses_count"] == 64 for h in result.history)


def test_checkpoints_hold_weights_optimizer_data_position_and_rng(collocated):
    root, _, result, _ = collocated
    ckpts = sorted((root / "run" / CHECKPOINTS).iterdir())
    assert [p.name for p in ckpts] == ["step_000003", "step_000006"] and result.last_checkpoint == ckpts[-1]
    for name in ("actor/config.json", "actor/model.safetensors", "actor/tokenizer.json", "training_state.pt",
                 "rng_actor0.pt", TRAINER_STATE):
        assert (ckpts[0] / name).is_file(), name
    state = json.loads((ckpts[0] / TRAINER_STATE).read_text())
    assert state["next_step"] == 3 and state["flow"]["loader"]["sampler"]["offset"] == 24


def test_resume_continues_exactly_where_the_run_was(collocated, tmp_path):
    root, cfg, result, _ = collocated
    resumed_cfg = toy_config(root, COLLOCATED, steps=6, run_dir=str(tmp_path / "resumed"), checkpoint_every=3,
                             resume=str(root / "run" / CHECKPOINTS / "step_000003"))
    resumed = train(WORKFLOW, resumed_cfg)
    assert len(resumed.history) == 3
    for key in ("reward/mean", "rollout/response_length", "actor/pg_loss", "actor/grad_norm", "actor/approx_kl"):
        want = [h[key] for h in result.history[3:]]
        got = [h[key] for h in resumed.history]
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), key
    # Every generator the actor saves (torch, numpy, Python) is seeded, so the resumed run's last checkpoint
    # holds the very RNG state of the uninterrupted run's.
    rng = f"{CHECKPOINTS}/step_000006/rng_actor0.pt"
    assert (tmp_path / "resumed" / rng).read_bytes() == (root / "run" / rng).read_bytes()


def test_eval_command_reads_a_training_checkpoint(collocated, capsys, tmp_path):
    root, _, result, _ = collocated
    out = tmp_path / "eval.json"
    code = main(["eval", "--output", str(out), str(result.last_checkpoint), "data.arithmetic.test_size=8",
                 "max_new_tokens=4"])
    assert code == 0
    results = json.loads(out.read_text())
    assert results["eval/prompts_count"] == 8 and 0 <= results["eval/accuracy"] <= 1
    assert "accuracy" in capsys.readouterr().out
    # The overrides reach generation: with a budget of one token every greedy response is one token.
    assert main(["eval", "--output", str(out), str(result.last_checkpoint), "data.arithmetic.test_size=8",
                 "max_new_tokens=1"]) == 0
    assert json.loads(out.read_text())["eval/response_length"] == 1.0



class Stage(Worker):
    """A stand-in stage: one waits for input that never comes, the other fails."""

    def wait_forever(self) -> None:
        time.sleep(600)

    def fail(self) -> None:
        raise ValueError("cannot score this")


def test_the_first_failing_stage_ends_the_iteration_while_others_still_wait():
    from tests.ray_session import shared_cluster

    waiting = WorkerGroup(Stage, shared_cluster(), "stage-waiting", num_ranks=1)
    failing = WorkerGroup(Stage, shared_cluster(), "stage-failing", num_ranks=1)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            gather([waiting.wait_forever(), failing.fail()])
        assert time.monotonic() - start < 60
        assert info.value.group == "stage-failing" and "cannot score this" in str(info.value)
    finally:
        waiting.shutdown()
        failing.shutdown()
