"""DAPO's data-side pieces (Yu et al. 2025, arXiv 2503.14476): dynamic sampling, overlong shaping.

Clip-higher is ``clip_high`` of the PPO loss and the token-level loss is the ``token-mean``
aggregation; they live with the other losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from m2flow.algorithms.groups import group_inverse, group_is_constant


@dataclass
class DynamicSamplingResult:
    """Which samples survive the filter: indices into the batch, in their original order."""

    kept_indices: Tensor  # (K,) int64
    num_groups: int
    num_groups_dropped: int


def dynamic_sampling_filter(
    scores: Tensor,
    *,
    group_index: Tensor | None = None,
    group_size: int | None = None,
    atol: float = 0.0,
) -> DynamicSamplingResult:
    """Drop every group whose scores (B,) are all equal (within ``atol``): its advantages are all 0.

    Such groups (all right or all wrong) give no gradient under group-relative estimators and
    only dilute the batch; DAPO keeps sampling until the batch is filled with informative groups.
    """
    inverse, num_groups = group_inverse(scores.shape[0], group_index, group_size, scores.device)
    informative = ~group_is_constant(scores, inverse, num_groups, atol)  # (G,)
    kept = torch.nonzero(informative[inverse]).squeeze(-1)
    return DynamicSamplingResult(kept, num_groups, int(num_groups - informative.sum().item()))


def overlong_penalty(
    response_lengths: Tensor, *, max_length: int, buffer_length: int, penalty: float = 1.0
) -> Tensor:
    """(B,) soft overlong punishment in [-penalty, 0] from response lengths (B,), added to rewards.

    0 up to ``max_length - buffer_length`` tokens, then falling linearly to ``-penalty`` at
    ``max_length``, and ``-penalty`` beyond it.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"need 0 < buffer_length <= max_length, got {buffer_length} and {max_length}")
    start = max_length - buffer_length
    over = (response_lengths.to(torch.float64) - start).clamp(min=0, max=buffer_length)
    return (-penalty * over / buffer_length).to(torch.get_default_dtype())
