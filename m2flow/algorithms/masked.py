"""Masked reductions and token placement shared by the estimators and losses.

Masks are 0/1 (bool, int or float) tensors of the same shape as the values; masked-out entries never
contribute, whatever value they hold (even inf or NaN: they are selected away, not multiplied by 0).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _select(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` where ``mask`` is set, 0 elsewhere (safe for inf/NaN in masked-out entries)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` over entries where ``mask`` is set (over ``dim`` or everything)."""
    selected = _select(values, mask)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over masked-in entries; 0 where there are none (no NaN from empty masks)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked-in entries (Bessel-corrected by default); 0 for fewer than 2 entries."""
    count = mask.bool().sum()
    mean = masked_mean(values, mask)
    sq = masked_sum((values - mean) ** 2, mask)
    denom = (count - 1) if unbiased else count
    # torch.where rather than an `if`: no host sync on accelerators.
    return torch.where(denom > 0, sq / denom.clamp(min=1).to(values.dtype), torch.zeros_like(sq))


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """(values - mean) / sqrt(var + eps) over masked-in entries; masked-out entries come back as 0.

    ``eps`` sits inside the square root, as in verl and OpenRLHF. With ``shift_mean`` a batch whose
    masked-in values are all equal whitens to exact zeros: its float mean can be one rounding step
    off the values, and that step divided by a std of the same size would be +-O(1) on every token.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    centred = values - mean if shift_mean else values
    out = centred * torch.rsqrt(var + eps)
    if shift_mean:
        out = torch.where(_is_constant(values, mask), torch.zeros_like(out), out)
    return _select(out, mask)


def _is_constant(values: Tensor, mask: Tensor) -> Tensor:
    """() bool: all masked-in values are equal (False for an empty mask)."""
    sel = mask.bool()
    high = torch.where(sel, values, torch.full_like(values, float("-inf"))).amax()
    low = torch.where(sel, values, torch.full_like(values, float("inf"))).amin()
    return high == low


def last_token_index(response_mask: Tensor) -> Tensor:
    """(B,) index of the last set position in each row of a (B, L) mask; -1 for empty rows."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    marked = torch.where(response_mask.bool(), positions, torch.full_like(positions, -1))
    return marked.max(dim=-1).values


def scores_to_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """(B, L) rewards with each sequence's score (B,) on its last response token, 0 elsewhere."""
    rewards = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    last = last_token_index(response_mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows]
    return rewards
