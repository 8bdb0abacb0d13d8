"""GSM8K through the whole loop with PPO (critic, GAE, reference KL) on a tiny random model.

A random model solves nothing, so the reward stays near 0: what is tested is the plumbing (reading
GSM8K, the math reward in its sandbox, the critic and the gathered update path, held-out evaluation).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from m2flow.config import from_dict
from m2flow.backends.training import sharded_checkpoint
from m2flow.models.causal_lm import load_causal_lm
from m2flow.workers.actor_files import SHARDS, whole_model_dir
from m2flow.driver.run import Run
from m2flow.workflows.reasoning.workflow import WORKFLOW
from m2flow.workflows.reasoning.config import ReasoningConfig
from tests.ray_session import shared_cluster

GSM8K = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "gsm8k"


@pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason="GSM8K is not available")
def test_gsm8k_ppo_runs_the_whole_loop(tmp_path):
    cfg = from_dict(ReasoningConfig, {
        # The actor's two ranks shard policy and critic with FSDP2 (lockstep passes, gathered updates).
        "placement": "rollout,reward: 0, inference: 1, actor: 1-2",
        "model": {"path": str(tmp_path / "model"), "create_tiny": True,
                  "tiny": {"tokenizer": "bpe", "vocab_size": 400, "hidden_size": 32, "intermediate_size": 64}},
        "data": {"kind": "gsm8k", "path": str(GSM8K), "limit": 16, "prompts_per_step": 4},
        "rollout": {"sampling": {"n": 2, "max_new_tokens": 12}},
        "reward": {"fn": "math", "timeout_s": 2.0},
        "algorithm": {"adv_estimator": "gae", "lam": 0.95, "kl_loss_coef": 0.01},
        "actor": {"strategy": "fsdp", "optim": {"lr": 1e-3}, "micro_batch_size": 2, "mini_batches": 2},
        "steps": 2, "eval_every": 2, "eval_size": 6, "checkpoint_every": 2,
        "run_dir": str(tmp_path / "run"), "metrics": {"sinks": ["jsonl"]},
    })
    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        assert len(run.flow.loader.dataset) == 16 and len(run.flow.test_set) == 1319
        result = run.train()
        received = [g for rank in run.flow.actor.received_groups().wait() for g in rank]
    assert result.mode == "hybrid"
    for h in result.history:
        for key in ("actor/pg_loss", "actor/kl_loss", "critic/value_loss", "actor/grad_norm", "critic/grad_norm"):
            assert math.isfinite(h[key]), key
        assert 0.0 <= h["reward/mean"] <= 1.0 and h["reward/timeouts_count"] >= 0
        assert h["rollout/responses_count"] == 8
    assert result.evaluations[0][1]["eval/prompts_count"] == 6 and "eval/accuracy" in result.history[-1]
    assert sorted((s, k) for s, k, _, _ in received) == [(s, k) for s in range(2) for k in range(4)]
    assert (result.run_dir / "metrics.jsonl").is_file()
    # FSDP saves each rank's own shards (nothing gathered): the policy as `m2flow eval` puts it
    # together, and the critic's trunk and value head, both whole from the shards of the two ranks.
    ckpt = result.last_checkpoint
    assert ckpt is not None and ckpt.name == "step_000002"
    assert not (ckpt / "actor" / "model.safetensors").exists()
    policy = load_causal_lm(whole_model_dir(ckpt / "actor", tmp_path / "whole"))
    assert sum(p.numel() for p in policy.parameters()) > 0
    critic = sharded_checkpoint.load_full(ckpt / "critic" / SHARDS, "model")
    assert critic["value_head.weight"].shape[0] == 1 and any(k.startswith("trunk.") for k in critic)
