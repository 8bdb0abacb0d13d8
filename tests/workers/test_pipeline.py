"""Every algorithm through the four reasoning workers in one process: finite losses, nothing lost."""

from __future__ import annotations

import math

import pytest

from m2flow.workers.config import ActorConfig, AlgorithmConfig, RewardConfig
from tests.workers.harness import Pipeline

ALGORITHMS = {
    "grpo": AlgorithmConfig(adv_estimator="grpo", kl_loss_coef=0.01),
    "dapo": AlgorithmConfig(adv_estimator="grpo", clip_high=0.28, dynamic_sampling=True, loss_agg="token-mean"),
    "reinforce_pp": AlgorithmConfig(adv_estimator="reinforce_pp", kl_reward_coef=0.01),
    "rloo": AlgorithmConfig(adv_estimator="rloo", loss_agg="seq-mean-token-mean", entropy_coef=0.01),
    "ppo": AlgorithmConfig(adv_estimator="gae", lam=0.95, kl_reward_coef=0.01),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_runs_iterations_with_finite_losses(tiny_ckpt, name):
    algo = ALGORITHMS[name]
    reward = RewardConfig(fn="tests.workflows.toy_reward:target_fraction",
                          overlong_buffer=3 if name == "dapo" else None)
    actor = ActorConfig(micro_batch_size=8, mini_batches=2 if name == "ppo" else 1)
    pipe = Pipeline(tiny_ckpt, algo, actor=actor, reward=reward)
    for step in range(3):
        m = pipe.step(step)
        assert m["rollout/responses_count"] == 16
        if m.get("actor/skipped_steps_count") and name == "dapo":
            continue  # every group was uninformative this time: no loss to check
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        if name == "ppo":
            assert math.isfinite(m["critic/value_loss"]) and m["critic/value_loss"] > 0
        if name == "grpo":
            assert math.isfinite(m["actor/kl_loss"])
        if name == "rloo":
            assert m["actor/entropy"] > 0
    # The actor took every group of every iteration exactly once, in the iteration it belongs to.
    received = pipe.actor.received_groups()
    assert sorted((s, slot) for s, slot, _, _ in received) == [(s, k) for s in range(3) for k in range(4)]


def test_streaming_path_is_taken_for_group_local_estimators(tiny_ckpt):
    assert Pipeline(tiny_ckpt, AlgorithmConfig(adv_estimator="grpo")).actor.streaming
    assert not Pipeline(tiny_ckpt, AlgorithmConfig(adv_estimator="reinforce_pp")).actor.streaming


def test_the_log_of_taken_groups_keeps_the_latest_only(tiny_ckpt, monkeypatch):
    monkeypatch.setattr("m2flow.workers.actor.RECEIVED_LOG", 6)
    pipe = Pipeline(tiny_ckpt, AlgorithmConfig(adv_estimator="grpo"), actor=ActorConfig(micro_batch_size=8))
    for step in range(3):
        pipe.step(step)
    received = pipe.actor.received_groups()
    assert len(received) == 6  # 12 groups taken; the 6 latest kept: two of iteration 1, all four of 2
    assert [s for s, _, _, _ in received] == [1, 1, 2, 2, 2, 2]
    assert sorted(slot for s, slot, _, _ in received if s == 2) == [0, 1, 2, 3]
