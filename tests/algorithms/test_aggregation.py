"""Loss aggregation modes: hand values, empty rows, exact micro-batch accumulation."""

from __future__ import annotations

import pytest
import torch

from m2flow.algorithms.aggregation import aggregate
from tests.algorithms import loop_reference as ref

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 7.0], [9.0, 9.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def test_hand_values():
    # tokens that count: row 0 -> 1, 2, 3; row 1 -> 4; row 2 none (excluded from sequence means)
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)  # 3
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)  # 5
    # Dr. GRPO: 10 / (2 sequences x 3 = L) and with a constant length of 5: 10 / 10
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(10 / 6)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=5).item() == pytest.approx(1.0)


def test_all_masked_is_zero_not_nan():
    for mode in MODES:
        assert aggregate(LOSS, torch.zeros(3, 3), mode).item() == 0.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(5))
def test_matches_loop_and_micro_batches_add_up(mode: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=gen) < 0.6).long()
    full = aggregate(loss, mask, mode)
    assert full.item() == pytest.approx(ref.aggregate(loss.tolist(), mask.tolist(), mode), abs=1e-12)
    # Two micro-batches, each divided by the whole mini-batch's count, sum to the full loss.
    count = mask.sum() if mode == "token-mean" else mask.any(dim=1).sum()
    extra = {"norm_length": 5} if mode == "seq-mean-token-sum-norm" else {}
    parts = sum(aggregate(loss[i : i + 3], mask[i : i + 3], mode, denominator=count, **extra) for i in (0, 3))
    assert parts.item() == pytest.approx(full.item(), abs=1e-12)


def test_unknown_mode_lists_choices():
    with pytest.raises(ValueError, match="valid names: seq-mean-token-mean, seq-mean-token-sum"):
        aggregate(LOSS, MASK, "mean")
