"""Exact resume beyond one collocated process: a run resumed from its checkpoint logs the same metrics
and ends with the same weights (``torch.equal``) as the run that went straight through, with the
rollout in processes of its own (disaggregated) and with two actor ranks (hybrid).

What these catch that the collocated resume tests cannot: state held by a rank of its own, such as
the generator of a separate embodied rollout rank or the sampling seeds of a separate reasoning
rollout rank, that a resume must restore on that rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from m2flow.workers.embodied.actor import ACTOR_FILE
from m2flow.workflows import embodied, reasoning
from m2flow.workflows.run import CHECKPOINTS
from tests.workflows import reasoning_setup, test_embodied

pytestmark = pytest.mark.timeout(900)

REASONING = {
    "disaggregated": "rollout: 0, reward: 1, inference: 2, actor: 3",
    "hybrid": "rollout,reward: 0, inference: 1, actor: 0-1",
}
# Each stage passes an iteration's groups on in one bundle (one chunk, micro-batches as large as the
# batch), so the actor's micro-batches, and with them the float sums, are the same in both runs.
BUNDLED = {"rollout": {"prompts_per_chunk": None}, "inference": {"micro_batch_size": 64},
           "actor": {"optim": {"lr": 0.02}, "micro_batch_size": 64}}
LOGGED = ("reward/mean", "rollout/response_length", "actor/pg_loss", "actor/grad_norm", "actor/approx_kl",
          "actor/entropy")


def _reasoning_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / CHECKPOINTS / f"step_{step:06d}" / "actor" / "model.safetensors"))


@pytest.mark.parametrize("mode", sorted(REASONING))
def test_a_resumed_reasoning_run_equals_the_run_that_went_through(cluster, tmp_path, mode):
    full_cfg = reasoning_setup.toy_config(tmp_path / "full", REASONING[mode], steps=4, checkpoint_every=2, **BUNDLED)
    full = reasoning.train(full_cfg, cluster)
    resumed_cfg = reasoning_setup.toy_config(
        tmp_path / "full", REASONING[mode], steps=4, checkpoint_every=2, run_dir=str(tmp_path / "resumed"),
        resume=str(Path(full_cfg.run_dir) / CHECKPOINTS / "step_000002"), **BUNDLED)
    resumed = reasoning.train(resumed_cfg, cluster)
    assert full.mode == resumed.mode == mode and len(resumed.history) == 2
    for key in LOGGED:
        assert [h.get(key) for h in resumed.history] == [h.get(key) for h in full.history[2:]], key
    a, b = _reasoning_weights(Path(full_cfg.run_dir), 4), _reasoning_weights(Path(resumed_cfg.run_dir), 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], v) for k, v in _reasoning_weights(Path(full_cfg.run_dir), 2).items())


def test_a_resumed_disaggregated_embodied_run_equals_the_run_that_went_through(cluster, tmp_path):
    placement = {"placement": "env: 0, rollout: 1, actor: 2", "pipeline_stages": 2, "checkpoint_every": 3}
    full_cfg = test_embodied.toy_config(tmp_path / "full", **placement)
    full = embodied.train(full_cfg, cluster=cluster)
    checkpoint = Path(full_cfg.run_dir) / CHECKPOINTS / "step_000003"
    resumed_cfg = test_embodied.toy_config(tmp_path / "resumed", resume=str(checkpoint), **placement)
    resumed = embodied.train(resumed_cfg, cluster=cluster)
    assert (full.mode, full.fused) == ("disaggregated", False) and len(resumed.history) == 3
    for a, b in zip(full.history[3:], resumed.history):
        for key in test_embodied.LEARNING:
            assert a.get(key) == b.get(key), key
    assert resumed.episodes == full.episodes
    final = [torch.load(Path(c.run_dir) / CHECKPOINTS / "step_000006" / ACTOR_FILE, weights_only=False)["policy"]
             for c in (full_cfg, resumed_cfg)]
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])
