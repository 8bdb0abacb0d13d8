"""Group bookkeeping for group-relative estimators: which samples answer the same prompt."""

from __future__ import annotations

import torch
from torch import Tensor


def group_inverse(
    n: int, group_index: Tensor | None, group_size: int | None, device: torch.device
) -> tuple[Tensor, int]:
    """(n,) dense group id in [0, G) per sample, and G; from ids (n,) or contiguous groups of a size."""
    if group_index is not None:
        if group_index.shape != (n,):
            raise ValueError(f"group_index must have shape ({n},), got {tuple(group_index.shape)}")
        unique, inverse = torch.unique(group_index, return_inverse=True)
        return inverse.to(device), int(unique.numel())
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"batch of {n} does not split into groups of {group_size}")
        return torch.arange(n, device=device) // group_size, n // group_size
    raise ValueError("pass group_index (ids per sample) or group_size (contiguous groups)")


def group_sum_count(values: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """Per-group sum (G,) of ``values`` (n,) and per-group sample count (G,)."""
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
    counts = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, inverse, torch.ones_like(values)
    )
    return sums, counts


def group_mean_std(values: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean, Bessel-corrected std (0 for singletons) and count, each (G,)."""
    sums, counts = group_sum_count(values, inverse, num_groups)
    mean = sums / counts.clamp(min=1)
    sq = torch.zeros_like(sums).index_add_(0, inverse, (values - mean[inverse]) ** 2)
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    return mean, std, counts


def group_is_constant(values: Tensor, inverse: Tensor, num_groups: int, atol: float = 0.0) -> Tensor:
    """(G,) bool: groups whose values (n,) are all equal within ``atol`` (max - min <= atol)."""
    high = torch.full((num_groups,), float("-inf"), dtype=values.dtype, device=values.device)
    low = torch.full((num_groups,), float("inf"), dtype=values.dtype, device=values.device)
    high = high.scatter_reduce(0, inverse, values, reduce="amax")
    low = low.scatter_reduce(0, inverse, values, reduce="amin")
    return (high - low) <= atol
