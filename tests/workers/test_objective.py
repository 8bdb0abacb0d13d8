"""Sum-form objectives: summed over micro-batches and divided once, they equal the whole-batch mean."""

from __future__ import annotations

import pytest
import torch

from m2flow.algorithms import aggregate, policy_loss
from m2flow.data.batch import RolloutBatch
from m2flow.workers.config import AlgorithmConfig
from m2flow.workers.objective import StepTotals, denominator, policy_objective


def _batch(mask: list[list[int]], adv: list[list[float]]) -> RolloutBatch:
    m = torch.tensor(mask)
    b = len(mask)
    return RolloutBatch(
        prompt_ids=torch.ones(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1, dtype=torch.long),
        response_ids=torch.ones_like(m), response_mask=m, group_ids=torch.zeros(b, dtype=torch.long),
        truncated=torch.zeros(b, dtype=torch.bool), advantages=torch.tensor(adv))


def test_denominator_counts_tokens_or_nonempty_sequences():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert denominator(mask, "token-mean") == 3
    assert denominator(mask, "seq-mean-token-mean") == 2


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_sums_over_the_global_count_equal_the_whole_batch_loss(agg):
    algo = AlgorithmConfig(loss_agg=agg, old_logprobs="actor")
    batch = _batch([[1, 1, 1], [1, 0, 0], [1, 1, 0]], [[1.0, 1.0, 1.0], [-2.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0], [-1.5, -0.2, 0.0]])
    # At ratio 1 the clipped PPO loss is -A per token.
    whole = policy_loss("ppo", logp, logp, batch.advantages, batch.response_mask, agg=agg)
    totals = StepTotals()
    for rows in ([0], [1, 2]):
        part = batch.select(rows)
        totals.add(policy_objective(logp[rows], None, part, algo))
    count, metrics = StepTotals.summarize(totals.as_vector())
    assert metrics["actor/pg_loss"] == pytest.approx(float(whole.loss), abs=1e-6)
    # By hand for token-mean: -(3 - 2 + 1) / 6 tokens.
    if agg == "token-mean":
        assert count == 6 and metrics["actor/pg_loss"] == pytest.approx(-2 / 6)
    assert float(aggregate(-batch.advantages, batch.response_mask, agg)) == pytest.approx(float(whole.loss))


def test_token_means_are_weighted_by_tokens_and_absent_metrics_stay_absent():
    totals = StepTotals()
    totals.count, totals.tokens = 4.0, 4.0
    totals.metrics = {"actor/pg_loss": 2.0, "actor/approx_kl": 0.4}  # sums: loss sum, kl x tokens
    count, metrics = StepTotals.summarize(totals.as_vector())
    assert count == 4 and metrics == {"actor/pg_loss": 0.5, "actor/approx_kl": 0.1}
