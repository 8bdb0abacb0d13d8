"""Continuous actions as discrete tokens: each dimension binned uniformly, as OpenVLA does.

Dimension ``d`` of an action in ``[low, high]`` maps to the bin ``floor((a - low) / width)``
(clipped to ``[0, num_bins - 1]``), ``width = (high - low) / num_bins``; a token maps back to its
bin's centre ``low + (token + 0.5) * width``. So ``to_tokens(to_actions(t)) == t`` exactly and
``|to_actions(to_tokens(a)) - clip(a)| <= width / 2``. The env acts on the centres; the policy's
log-probabilities are those of the tokens, recovered from the centres it emitted.
"""

from __future__ import annotations

import torch
from torch import Tensor


class ActionBins:
    """Uniform bins over ``[low, high]`` for every action dimension."""

    def __init__(self, num_bins: int = 256, low: float = -1.0, high: float = 1.0) -> None:
        if num_bins < 2:
            raise ValueError(f"num_bins: must be >= 2, got {num_bins}")
        if not high > low:
            raise ValueError(f"action bounds must satisfy high > low, got [{low}, {high}]")
        self.num_bins, self.low, self.high = num_bins, float(low), float(high)
        self.width = (self.high - self.low) / num_bins

    def to_tokens(self, actions: Tensor) -> Tensor:
        """Actions (..., A) float -> tokens (..., A) int64 in [0, num_bins)."""
        index = torch.floor((actions.float() - self.low) / self.width)
        return index.clamp(0, self.num_bins - 1).long()

    def to_actions(self, tokens: Tensor) -> Tensor:
        """Tokens (..., A) -> the bin centres (..., A) float32."""
        return self.low + (tokens.float() + 0.5) * self.width
