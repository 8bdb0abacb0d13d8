"""Token sampling shared by the lean backend's two decoding loops: HF's logit warpers, and drawing a token
by inverting the cumulative distribution at a given uniform (continuous batching's per-prompt draws)."""

from __future__ import annotations

import torch

from m2flow.backends.generation.base import SamplingParams

__all__ = ["inverse_cdf_sample", "warp_logits"]


def warp_logits(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Scores (B, V) to sample from, as HF's warpers make them: / temperature, then top-k, then top-p."""
    if params.temperature != 1.0:
        scores = scores / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1]))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        # Drop the low tail whose total probability stays within 1 - top_p; the top token always stays.
        drop = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - params.top_p
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Tokens (B,) drawn from probs (B, V) (rows need not sum to 1) at uniforms (B,) in [0, 1)."""
    cdf = probs.cumsum(-1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return token.clamp_(max=probs.shape[-1] - 1)
