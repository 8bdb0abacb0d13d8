"""A rank frozen with SIGSTOP (alive to Ray and to its sockets, answering nothing) is caught by
``fault_tolerance.iteration_timeout_s`` like a dead one, wherever the driver waits on it: in an
iteration, a weight sync, an evaluation and a checkpoint. One run per workflow freezes at each of
those in turn (the rank stops itself at the chosen call: ``runtime/faults.py``), restarts from its
newest checkpoint each time, and ends equal to the same run left alone: each step logged once, the same
metrics, the same final weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from m2flow.driver.checkpoints import CHECKPOINTS
from tests.ray_session import shared_cluster
from tests.workflows.reasoning import setup as reasoning_setup
from tests.workflows.frozen import Caught, freezing

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(2400)]  # five launches each, on a busy machine

DEADLINE = 30.0
"""fault_tolerance.iteration_timeout_s of these runs: above the slowest first iteration of a tiny run (its
workers' first calls import and warm up: 15 s seen on a loaded 2-core machine), so a frozen rank trips it."""
SPARE = 2
"""Restarts allowed beyond the frozen points, should a cold first iteration on a loaded machine pass the deadline
(the run must end equal to the calm one all the same)."""
SLACK = 5.0
"""Seconds past the deadline a restart may take: the teardown of the groups, none of it waiting on the frozen rank."""


def _rows(run_dir: str) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _check_caught(caught: list[Caught], points: list[str], waits: list[str]) -> None:
    """Every point fired, in order, and its restart came within the deadline plus the slack, naming the wait."""
    assert [c.point for c in caught] == points
    for c, wait in zip(caught, waits):
        print(f"{c.point}: caught after {c.seconds:.2f}s ({c.message.split(' hung: ')[-1][:90]})")
        assert "hung" in c.message and wait in c.message, (c.point, c.message)
        assert DEADLINE - 0.5 < c.seconds < DEADLINE + SLACK, (c.point, c.seconds, c.message)


# Reasoning: the rollout (with the reward on its device) apart from the actor and inference. Each stage passes
# an iteration's groups on in one bundle, so a resumed run sums the same floats (as the resume tests do).
REASONING = dict(steps=4, eval_every=2, checkpoint_every=1,
                 rollout={"prompts_per_chunk": None}, inference={"micro_batch_size": 64},
                 actor={"optim": {"lr": 0.02}, "micro_batch_size": 64})
REASONING_POINTS = [
    "rollout.generate@2",  # iteration 1 (after the baseline evaluation, iteration 0 and its checkpoint)
    "rollout.receive_weights@2",  # the weight sync before the evaluation after iteration 1 (of the resumed run)
    "rollout.evaluate",  # that evaluation itself
    "actor.save_checkpoint",  # the checkpoint after it
]
REASONING_WAITS = ["during iteration 1", "during the weight sync before an evaluation", "during the held-out evaluation",
                   "during a checkpoint"]
COMPARED = ("step", "reward/mean", "rollout/response_length", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
            "eval/accuracy")


def _final_weights(run_dir: str, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / CHECKPOINTS / f"step_{step:06d}" / "actor" / "model.safetensors"))


def test_reasoning_frozen_in_each_wait_restarts_and_ends_as_if_left_alone(tmp_path, monkeypatch):
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING_WORKFLOW

    placement = "rollout,reward: 0, inference,actor: 1"
    faults = {"iteration_timeout_s": DEADLINE, "max_restarts": len(REASONING_POINTS) + SPARE}
    cfg = reasoning_setup.toy_config(tmp_path / "interrupted", placement, fault_tolerance=faults, **REASONING)
    with freezing(tmp_path, monkeypatch, REASONING_POINTS) as plan:
        result = train(REASONING_WORKFLOW, cfg, shared_cluster())
        caught = plan.caught()
    _check_caught(caught, REASONING_POINTS, REASONING_WAITS)
    assert len(REASONING_POINTS) <= result.restarts <= len(REASONING_POINTS) + SPARE
    calm_cfg = reasoning_setup.toy_config(tmp_path / "calm", placement, **REASONING)
    train(REASONING_WORKFLOW, calm_cfg, shared_cluster())
    rows, calm = _rows(cfg.run_dir), _rows(calm_cfg.run_dir)
    assert [r["step"] for r in rows] == [r["step"] for r in calm] == [0, 1, 2, 3, 4]  # each step once
    for key in COMPARED:
        assert [r.get(key) for r in rows] == [r.get(key) for r in calm], key
    a, b = _final_weights(cfg.run_dir, 4), _final_weights(calm_cfg.run_dir, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# Embodied: env, rollout and actor on devices of their own, two pipeline stages (as the resume tests run it).
EMBODIED = {"placement": "env: 0, rollout: 1, actor: 2", "pipeline_stages": 2, "eval_every": 2, "eval_episodes": 2,
            "checkpoint_every": 1}
EMBODIED_POINTS = [
    "rollout.act@2",  # iteration 1 (after iteration 0 and its checkpoint)
    "rollout.receive_weights@2",  # the weight sync before iteration 2 (of the run resumed at iteration 1)
    "actor.state_dict",  # the evaluation after iteration 3 (of the run resumed at iteration 2)
    "actor.save_checkpoint",  # the checkpoint after it (of the run resumed at iteration 3)
]
EMBODIED_WAITS = ["during iteration 1", "during a weight sync", "during an evaluation", "during a checkpoint"]


def test_embodied_frozen_in_each_wait_restarts_and_ends_as_if_left_alone(tmp_path, monkeypatch):
    from m2flow.workers.embodied.actor import ACTOR_FILE
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED_WORKFLOW
    from tests.workflows.embodied.setup import LEARNING, toy_config

    faults = {"fault_tolerance.iteration_timeout_s": DEADLINE, "fault_tolerance.max_restarts": len(EMBODIED_POINTS) + SPARE}
    cfg = toy_config(tmp_path / "interrupted", **EMBODIED, **faults)
    with freezing(tmp_path, monkeypatch, EMBODIED_POINTS) as plan:
        result = train(EMBODIED_WORKFLOW, cfg, cluster=shared_cluster())
        caught = plan.caught()
    _check_caught(caught, EMBODIED_POINTS, EMBODIED_WAITS)
    assert len(EMBODIED_POINTS) <= result.restarts <= len(EMBODIED_POINTS) + SPARE
    calm_cfg = toy_config(tmp_path / "calm", **EMBODIED)
    calm = train(EMBODIED_WORKFLOW, calm_cfg, cluster=shared_cluster())
    rows, calm_rows = _rows(cfg.run_dir), _rows(calm_cfg.run_dir)
    assert [r["step"] for r in rows] == [r["step"] for r in calm_rows] == [512 * i for i in range(7)]
    for key in (*LEARNING, "eval/return"):
        assert [r.get(key) for r in rows] == [r.get(key) for r in calm_rows], key
    assert result.episodes == calm.episodes
    final = [torch.load(Path(c.run_dir) / CHECKPOINTS / "step_000006" / ACTOR_FILE, weights_only=False)["policy"]
             for c in (cfg, calm_cfg)]
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])


# Agentic: two env workers, the rollout and the actor taking turns on one device.
AGENTIC = {"placement": "env: 0-1, rollout,actor: 0", "steps": 4, "eval_every": 2, "checkpoint_every": 1}
AGENTIC_POINTS = [
    "rollout.play_turn@2",  # the second turn of iteration 0
    "rollout.receive_weights@2",  # the weight sync before iteration 1 (the first was the baseline evaluation's)
    "rollout.evaluate",  # the evaluation after iteration 1 (of the run resumed at iteration 1)
    "actor.save_checkpoint",  # the checkpoint after it
]
AGENTIC_WAITS = ["during rollout: play_turn", "during a weight sync", "during the held-out evaluation",
                 "during a checkpoint"]


def test_agentic_frozen_in_each_wait_restarts_and_ends_as_if_left_alone(tmp_path, monkeypatch):
    from m2flow.autoplan.entry import train
    from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC_WORKFLOW
    from tests.workflows.agentic.setup import comparable, tiny_config

    faults = {"fault_tolerance.iteration_timeout_s": DEADLINE, "fault_tolerance.max_restarts": len(AGENTIC_POINTS) + SPARE}
    cfg = tiny_config(tmp_path / "interrupted", tmp_path / "model", **AGENTIC, **faults)
    with freezing(tmp_path, monkeypatch, AGENTIC_POINTS) as plan:
        result = train(AGENTIC_WORKFLOW, cfg, cluster=shared_cluster())
        caught = plan.caught()
    _check_caught(caught, AGENTIC_POINTS, AGENTIC_WAITS)
    assert len(AGENTIC_POINTS) <= result.restarts <= len(AGENTIC_POINTS) + SPARE
    calm = train(AGENTIC_WORKFLOW, tiny_config(tmp_path / "calm", tmp_path / "model", **AGENTIC), cluster=shared_cluster())
    rows, calm_rows = _rows(cfg.run_dir), _rows(str(tmp_path / "calm" / "run"))
    assert [r["step"] for r in rows] == [r["step"] for r in calm_rows] == [0, 1, 2, 3, 4]  # each step once
    # Each episode's turns are seeded by its own id: the run ends where the calm one does (up to the order in
    # which the actor summed the groups, as the agentic restart tests hold).
    learned, calm_learned = ([{k: v for k, v in r.items() if k != "time" and not k.startswith("faults/")}
                              for r in comparable(x)] for x in (rows, calm_rows))
    assert [sorted(r) for r in learned] == [sorted(r) for r in calm_learned]
    for r, c in zip(learned, calm_learned):
        assert r == pytest.approx(c, rel=1e-5)
