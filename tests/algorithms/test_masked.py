"""Masked reductions and placing outcome scores on last tokens."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from m2flow.algorithms.advantages import grpo_outcome_advantage, rloo_advantage
from m2flow.algorithms.masked import (
    last_token_index,
    masked_mean,
    masked_var,
    masked_whiten,
    scores_to_token_rewards,
)


def test_masked_stats_by_hand():
    x = torch.tensor([[1.0, 3.0, float("inf")], [5.0, float("nan"), 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # entries 1, 3, 5: mean 3, unbiased var (4 + 0 + 4) / 2 = 4
    assert masked_mean(x, m).item() == 3.0
    assert masked_var(x, m).item() == 4.0
    assert math.isclose(masked_var(x, m, unbiased=False).item(), 8 / 3, rel_tol=1e-6)
    torch.testing.assert_close(masked_mean(x, m, dim=1), torch.tensor([2.0, 5.0]))
    w = masked_whiten(x, m, eps=0.0)
    torch.testing.assert_close(w, torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0  # empty mask: 0, not NaN
    assert masked_var(x, torch.tensor([[1, 0, 0], [0, 0, 0]])).item() == 0.0


def test_scores_land_on_last_response_token():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]])
    assert last_token_index(mask).tolist() == [1, -1, 3]
    rewards = scores_to_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert rewards.tolist() == [[0, 2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]]


@settings(max_examples=50, deadline=None)
@given(
    scores=st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=2, max_size=12),
    k=st.integers(2, 4),
    seed=st.integers(0, 2**16),
)
def test_group_advantages_are_permutation_equivariant_and_sum_to_zero(scores, k, seed):
    n = len(scores) - len(scores) % k
    if n == 0:
        return
    x = torch.tensor(scores[:n], dtype=torch.float64)
    ids = torch.arange(n) // k
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    for fn in (grpo_outcome_advantage, rloo_advantage):
        a = fn(x, group_index=ids)
        torch.testing.assert_close(fn(x[perm], group_index=ids[perm]), a[perm])
        group_sums = torch.zeros(n // k, dtype=torch.float64).index_add_(0, ids, a)
        scale = max(1.0, float(x.abs().max()))
        assert all(math.isclose(s, 0.0, abs_tol=1e-9 * scale * k) for s in group_sums.tolist())


def test_a_constant_batch_whitens_to_exact_zeros():
    # 0.1 * 7 tokens: the float32 mean is one rounding step off 0.1, and (x - mean) / (std + eps)
    # made that step +-O(1) on every token.
    x = torch.full((1, 7), 0.1, dtype=torch.float32)
    mask = torch.ones(1, 7)
    assert masked_mean(x, mask).item() != torch.tensor(0.1, dtype=torch.float32).item()
    assert torch.equal(masked_whiten(x, mask), torch.zeros(1, 7))
    assert torch.equal(masked_whiten(x, mask, eps=0.0), torch.zeros(1, 7))  # no 0 * inf


def test_whitening_puts_eps_inside_the_square_root():
    x = torch.tensor([[0.0, 1e-4]])
    mask = torch.ones(1, 2)
    var = 0.5e-8  # unbiased variance of {0, 1e-4}
    expected = torch.tensor([[-0.5e-4, 0.5e-4]]) / math.sqrt(var + 1e-8)
    torch.testing.assert_close(masked_whiten(x, mask, eps=1e-8), expected)
