"""The same loop disaggregated (FSDP actor) and hybrid (DDP actor): reward improves, weights sync exactly."""

from __future__ import annotations

import pytest

from m2flow.runtime.waiting import gather
from m2flow.driver.run import Run
from m2flow.workflows.reasoning.workflow import WORKFLOW
from m2flow.runtime.trace import iter_spans, load_trace
from tests.ray_session import shared_cluster
from tests.workflows.reasoning.setup import improved, toy_config

PLACEMENTS = {
    # Every component on its own devices; two actor ranks shard the policy with FSDP2.
    "disaggregated": ("rollout: 0, reward: 1, inference: 2, actor: 3-4", "fsdp"),
    # Rollout and reward on device 0, inference on 1, the actor's two DDP ranks on both.
    "hybrid": ("rollout,reward: 0, inference: 1, actor: 0-1", "ddp"),
}


@pytest.mark.learning
@pytest.mark.parametrize("mode", sorted(PLACEMENTS))
def test_grpo_learns_and_weight_sync_is_bit_exact(tmp_path, mode):
    placement, strategy = PLACEMENTS[mode]
    cfg = toy_config(tmp_path, placement, actor={"strategy": strategy}, rollout={"prompts_per_chunk": 4},
                     trace=True)
    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        result = run.train()
        flow = run.flow
        gather(flow.sync_weights(flow.progress()))
        actor = flow.actor.weights_digest().wait()[0]  # rank 0 holds the full weights
        rollout = flow.rollout.weights_digest().wait()
        inference = flow.inference.weights_digest().wait()
        received = flow.actor.received_groups().wait()
        # Reward sharing rollout's devices scores in the rollout process; on its own device it has workers.
        reward_workers = flow.reward is not None
    assert result.mode == mode
    assert reward_workers == (mode == "disaggregated")
    assert improved(result.history), [h["reward/mean"] for h in result.history]
    assert rollout == [actor] and inference == [actor]
    # Two actor ranks: each group went to exactly one of them, and each rank got half of every iteration.
    taken = sorted((s, k) for rank in received for s, k, _, _ in rank)
    assert taken == [(s, k) for s in range(6) for k in range(8)]
    assert [len(rank) for rank in received] == [24, 24]
    # The timeline shows every stage, and the driver's iterations.
    spans = list(iter_spans(load_trace(result.run_dir)))
    cats = {s["cat"] for s in spans}
    assert {"step", "generate", "reward", "logprobs", "train", "weight_sync"} <= cats
    assert sum(1 for s in spans if s["cat"] == "step") == 6
