"""Exact resume beyond one collocated process: a run resumed from its checkpoint logs the same metrics
and ends with the same weights (``torch.equal``) as the run that went straight through, with the
rollout in processes of its own (disaggregated), with two actor ranks (hybrid; reasoning with DDP and
with FSDP, GRPO and PPO, embodied with eager and with compiled steps). A corrupted shard of the FSDP
run's newest checkpoint is named before anything loads.

What these catch that the collocated resume tests cannot: state held by a rank of its own, such as
the generator of a separate embodied rollout rank or the sampling seeds of a separate reasoning
rollout rank, that a resume must restore on that rank.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from m2flow.backends.training import sharded_checkpoint
from m2flow.models.causal_lm import load_causal_lm
from m2flow.workers.actor_files import SHARDS, whole_model_dir
from m2flow.workers.embodied.actor import ACTOR_FILE
from m2flow.autoplan.entry import train
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED_WORKFLOW
from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING_WORKFLOW
from m2flow.driver.checkpoints import CHECKPOINTS, CheckpointError, find_checkpoint
from tests.workflows.embodied import setup as embodied_setup
from tests.workflows.reasoning import setup as reasoning_setup

pytestmark = pytest.mark.timeout(900)

REASONING = {  # case: (placement, actor strategy, algorithm)
    "disaggregated": ("rollout: 0, reward: 1, inference: 2, actor: 3", "ddp", "grpo"),
    "hybrid": ("rollout,reward: 0, inference: 1, actor: 0-1", "ddp", "grpo"),
    # Two FSDP2 ranks: each saves its own shards (actor/shards/, and critic/shards/ with PPO), nothing gathered.
    "hybrid-fsdp": ("rollout,reward: 0, inference: 1, actor: 0-1", "fsdp", "grpo"),
    "hybrid-fsdp-ppo": ("rollout,reward: 0, inference: 1, actor: 0-1", "fsdp", "gae"),
}
# Cases whose state the others already cover (DDP ranks save one gathered file as a single rank does;
# sharded resume is hybrid-fsdp's): in the full suite only (`make test-all`).
SLOW = {"hybrid", "hybrid-fsdp-ppo"}
# Each stage passes an iteration's groups on in one bundle (one chunk, micro-batches as large as the
# batch), so the actor's micro-batches, and with them the float sums, are the same in both runs.
BUNDLED = {"rollout": {"prompts_per_chunk": None}, "inference": {"micro_batch_size": 64},
           "actor": {"optim": {"lr": 0.02}, "micro_batch_size": 64}}
LOGGED = ("reward/mean", "rollout/response_length", "actor/pg_loss", "actor/grad_norm", "actor/approx_kl",
          "actor/entropy")
STEPS = 3  # checkpoints after every step; the resumed run starts after the first and runs the last two


def _reasoning_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    actor = run_dir / CHECKPOINTS / f"step_{step:06d}" / "actor"
    if (actor / SHARDS).is_dir():
        return sharded_checkpoint.load_full(actor / SHARDS, "model")
    return load_file(str(actor / "model.safetensors"))


def _reasoning_config(root: Path, case: str, **overrides):
    placement, strategy, estimator = REASONING[case]
    bundled = {**BUNDLED, "actor": {**BUNDLED["actor"], "strategy": strategy}}
    return reasoning_setup.toy_config(root, placement, steps=STEPS, checkpoint_every=1,
                                      algorithm={"adv_estimator": estimator}, **bundled, **overrides)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c
                                  for c in sorted(REASONING)])
def test_a_resumed_reasoning_run_equals_the_run_that_went_through(cluster, tmp_path, case):
    full_cfg = _reasoning_config(tmp_path / "full", case)
    full = train(REASONING_WORKFLOW, full_cfg, cluster)
    checkpoint = Path(full_cfg.run_dir) / CHECKPOINTS / "step_000001"
    resumed_cfg = _reasoning_config(tmp_path / "full", case, run_dir=str(tmp_path / "resumed"), resume=str(checkpoint))
    resumed = train(REASONING_WORKFLOW, resumed_cfg, cluster)
    mode = case.split("-")[0]
    assert full.mode == resumed.mode == mode and len(resumed.history) == STEPS - 1
    for key in LOGGED:
        assert [h.get(key) for h in resumed.history] == [h.get(key) for h in full.history[1:]], key
    a, b = _reasoning_weights(Path(full_cfg.run_dir), STEPS), _reasoning_weights(Path(resumed_cfg.run_dir), STEPS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], v) for k, v in _reasoning_weights(Path(full_cfg.run_dir), 1).items())
    if REASONING[case][1] == "fsdp":
        folders = ["actor", "critic"] if REASONING[case][2] == "gae" else ["actor"]
        for folder in folders:
            assert sorted(p.name for p in (checkpoint / folder / SHARDS).glob("*.distcp")) == ["__0_0.distcp",
                                                                                              "__1_0.distcp"]
        assert not list(checkpoint.rglob("*.safetensors"))  # nothing was gathered
    if case == "hybrid-fsdp":
        _a_corrupted_shard_is_named_before_anything_loads(full_cfg, cluster, tmp_path)


def _a_corrupted_shard_is_named_before_anything_loads(cfg, cluster, tmp_path):
    """One flipped byte in one rank's shard: the resume names that file, and ``auto`` takes the checkpoint before."""
    newest = Path(cfg.run_dir) / CHECKPOINTS / f"step_{STEPS:06d}"
    shard = newest / "actor" / SHARDS / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{shard}: corrupted"):
        train(REASONING_WORKFLOW, replace(cfg, resume=str(newest)), cluster)
    previous = find_checkpoint("auto", cfg.run_dir)
    assert previous == Path(cfg.run_dir) / CHECKPOINTS / f"step_{STEPS - 1:06d}"
    # What `m2flow eval` reads from a sharded checkpoint: a model directory with the shards put together.
    model = load_causal_lm(whole_model_dir(previous / "actor", tmp_path / "whole"))
    saved = sharded_checkpoint.load_full(previous / "actor" / SHARDS, "model")
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


EMBODIED = {
    "disaggregated": {"placement": "env: 0, rollout: 1, actor: 2"},
    # Env and rollout pipelined on devices of their own, the actor's two ranks over both (DDP).
    "hybrid": {"placement": "env: 0, rollout: 1, actor: 0-1"},
    "hybrid-compiled": {"placement": "env: 0, rollout: 1, actor: 0-1", "actor.compile": True},
}


# The uncompiled hybrid resumes what hybrid-compiled does, on the same placement: slow.
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "hybrid" else c
                                  for c in sorted(EMBODIED)])
def test_a_resumed_embodied_run_equals_the_run_that_went_through(cluster, tmp_path, case):
    placement = {**EMBODIED[case], "pipeline_stages": 2, "checkpoint_every": 3}
    mode = case.split("-")[0]
    full_cfg = embodied_setup.toy_config(tmp_path / "full", **placement)
    full = train(EMBODIED_WORKFLOW, full_cfg, cluster=cluster)
    checkpoint = Path(full_cfg.run_dir) / CHECKPOINTS / "step_000003"
    resumed_cfg = embodied_setup.toy_config(tmp_path / "resumed", resume=str(checkpoint), **placement)
    resumed = train(EMBODIED_WORKFLOW, resumed_cfg, cluster=cluster)
    assert (full.mode, full.plan.fused("rollout")) == (mode, False) and len(resumed.history) == 3
    for a, b in zip(full.history[3:], resumed.history):
        for key in embodied_setup.LEARNING:
            assert a.get(key) == b.get(key), key
    assert resumed.episodes == full.episodes
    final = [torch.load(Path(c.run_dir) / CHECKPOINTS / "step_000006" / ACTOR_FILE, weights_only=False)["policy"]
             for c in (full_cfg, resumed_cfg)]
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])
