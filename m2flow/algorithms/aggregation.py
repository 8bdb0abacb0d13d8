"""Reduce a (B, L) per-token loss to a scalar; padding never counts.

Modes (the names used across RL-for-LLM code):
- ``token-mean``: every response token weighs the same (DAPO's token-level loss, Yu et al. 2025);
- ``seq-mean-token-mean``: mean per sequence, then over sequences (the original GRPO objective);
- ``seq-mean-token-sum``: sum per sequence, then mean over sequences;
- ``seq-mean-token-sum-norm``: sum over tokens divided by sequences x a constant length
  (Dr. GRPO, Liu et al. 2025: no per-response length normalisation).
Sequences without any response token are left out of sequence means.

``denominator`` replaces the count this batch would divide by (tokens for token-mean, sequences
otherwise). Pass the count of the whole mini-batch when it is split into micro-batches for
gradient accumulation, so the micro-batch losses add up to the mini-batch loss exactly.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from m2flow.algorithms.masked import masked_mean, masked_sum
from m2flow.algorithms.registry import LOSS_AGGREGATIONS

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _divide(total: Tensor, count: Tensor | float) -> Tensor:
    count = torch.as_tensor(count, dtype=total.dtype, device=total.device)
    return total / count.clamp(min=1)


def _nonempty(mask: Tensor) -> Tensor:
    """(B,) bool: rows with at least one response token."""
    return mask.bool().any(dim=-1)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(loss: Tensor, mask: Tensor, *, denominator: float | None = None) -> Tensor:
    """Scalar: sum over response tokens of loss (B, L) / number of response tokens."""
    count = mask.bool().sum() if denominator is None else denominator
    return _divide(masked_sum(loss, mask), count)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, *, denominator: float | None = None) -> Tensor:
    """Scalar: mean over non-empty sequences of each sequence's token mean of loss (B, L)."""
    per_seq = masked_mean(loss, mask, dim=-1)
    rows = _nonempty(mask)
    return _divide(masked_sum(per_seq, rows), rows.sum() if denominator is None else denominator)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss: Tensor, mask: Tensor, *, denominator: float | None = None) -> Tensor:
    """Scalar: mean over non-empty sequences of each sequence's token sum of loss (B, L)."""
    rows = _nonempty(mask)
    return _divide(masked_sum(loss, mask), rows.sum() if denominator is None else denominator)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss: Tensor, mask: Tensor, *, norm_length: int | None = None, denominator: float | None = None
) -> Tensor:
    """Scalar: token sum of loss (B, L) / (non-empty sequences x norm_length, default L)."""
    rows = _nonempty(mask)
    length = loss.shape[-1] if norm_length is None else norm_length
    seqs = rows.sum() if denominator is None else denominator
    return _divide(masked_sum(loss, mask), torch.as_tensor(seqs, dtype=loss.dtype) * length)


def aggregate(
    loss: Tensor, mask: Tensor, mode: AggMode | str = "token-mean", **kwargs: float | int | None
) -> Tensor:
    """Scalar reduction of a (B, L) loss under ``mode`` (see ``LOSS_AGGREGATIONS.names()``)."""
    return LOSS_AGGREGATIONS.get(mode)(loss, mask, **kwargs)
