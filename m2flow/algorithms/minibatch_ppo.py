"""The PPO loss of one embodied minibatch, as Stable-Baselines3 and CleanRL define it, over unmasked samples.

This is the one definition the embodied PPO update (``m2flow.workers.embodied.ppo``) minimises: its
autograd path differentiates this function, and the closed-form gradient
(``m2flow.workers.embodied.closed_form``, also run compiled) is tested against that autograd gradient.

It is ``ppo_policy_loss`` of ``losses.py`` over an all-valid (1, n) batch (token-mean), plus
``vf_coef`` times the squared value error, optionally PPO-clipped around the old values, minus
``ent_coef`` times the mean entropy (Schulman et al. 2017, arXiv 1707.06347). It deviates from
``losses.py`` where SB3 does:

- the value loss is the mean squared error without ``value_loss``'s 1/2, so ``vf_coef`` means what it
  means in SB3 and CleanRL;
- it is written for speed on small policies, where a step costs what its operations cost to dispatch:
  no mask, the mean's 1/n (``scale``) folded into the advantages by the caller, and the sums the
  metrics need returned as one tensor. With data-parallel ranks each rank passes its share of the
  minibatch (B <= n samples) with the minibatch's scale, and the shares' losses add up to the loss of
  the whole minibatch.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MINIBATCH_PARTS", "ppo_minibatch_loss"]

MINIBATCH_PARTS = ("pg", "sq", "ratio", "log_ratio", "clipped")
"""What the parts returned by ``ppo_minibatch_loss`` are, in order."""


def ppo_minibatch_loss(
    log_ratio: Tensor,
    neg_adv: Tensor,
    values: Tensor | None,
    returns: Tensor,
    *,
    clip: float,
    scale: float,
    vf_coef: float = 0.5,
    old_values: Tensor | None = None,
    value_clip: float | None = None,
    ent_coef: float = 0.0,
    entropy_sum: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """This share's part of one minibatch's PPO loss (a scalar), and its summed parts for the metrics (5,).

    Args:
        log_ratio: (B,) log pi(a|s) - log pi_old(a|s), differentiable.
        neg_adv: (B,) minus the (whitened) advantages times ``scale``.
        values: (B,) value estimates V(s), differentiable; None: no critic, no value loss.
        returns: (B,) value targets.
        clip: the ratio is clipped to [1 - clip, 1 + clip].
        scale: 1 / n, n the number of samples of the whole minibatch.
        vf_coef: weight of the value loss.
        old_values: (B,) the acting policy's values, needed with ``value_clip``.
        value_clip: clip V - old_values to [-value_clip, value_clip] (the larger error counts); None: off.
        ent_coef: weight of the entropy bonus; 0: off.
        entropy_sum: (,) the summed entropy of the B samples' action distributions, needed with ``ent_coef``.

    Returns:
        ``(loss, parts)``: ``loss`` = sum max(neg_adv r, neg_adv clip(r)) + vf_coef * scale * sum (V - R)^2
        - ent_coef * scale * entropy_sum, r = exp(log_ratio); ``parts`` (5,), detached, as
        ``MINIBATCH_PARTS``: the policy loss (already scaled), the summed squared value error (0 without
        a critic), the sums of the ratio and of the log-ratio, and the number of clipped ratios.
    """
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
    pg = torch.maximum(neg_adv * ratio, neg_adv * clipped).sum()
    if values is not None:
        error = values - returns
        if value_clip is None:
            sq = torch.dot(error, error)
        else:
            if old_values is None:
                raise ValueError("value_clip needs old_values")
            moved = old_values + (values - old_values).clamp(-value_clip, value_clip)
            sq = torch.maximum(error.square(), (moved - returns).square()).sum()
        loss = torch.add(pg, sq, alpha=vf_coef * scale)
    else:
        sq = torch.zeros((), device=pg.device)
        loss = pg
    if ent_coef:
        if entropy_sum is None:
            raise ValueError("ent_coef needs entropy_sum")
        loss = loss - (ent_coef * scale) * entropy_sum
    with torch.no_grad():
        parts = torch.stack((pg, sq, ratio.sum(), log_ratio.sum(), (clipped != ratio).sum().to(ratio.dtype)))
    return loss, parts
