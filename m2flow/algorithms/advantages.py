"""Advantage estimators as pure tensor functions.

Two layouts:
- token batches (reasoning RL): B sequences of response length L, batch-major, (B, L), with a
  ``response_mask`` (1 on response tokens, 0 on padding or tokens the policy did not produce);
- step batches (embodied RL): T steps of N parallel environments, time-major, (T, N), with
  ``dones`` marking the last step of each episode.

Where this deviates from the textbook:
- token GAE and discounted returns skip masked-out positions instead of stopping at them, so a
  response with holes (tool output inside a turn) is treated as one contiguous sequence;
- a group of one sample has no baseline, so its GRPO/RLOO advantage is 0 rather than its raw score;
- a group whose scores are all equal gets exactly 0 (decided by comparing max and min, so float
  rounding in the group mean cannot leak a tiny advantage, even with eps = 0);
- GRPO's std is Bessel-corrected (n - 1), as in the DeepSeekMath reference code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from m2flow.algorithms.groups import group_inverse, group_is_constant, group_mean_std, group_sum_count
from m2flow.algorithms.masked import masked_whiten


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    next_values: Tensor,
    *,
    gamma: float = 0.99,
    lam: float = 0.95,
    terminated: Tensor | None = None,
    final_values: Tensor | None = None,
    discounts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda) over a time-major rollout (Schulman et al. 2015, arXiv 1506.02438).

    rewards, values, dones: (T, N); ``dones[t]`` is set when an episode ended at step t (the env
    auto-reset, so ``values[t + 1]`` belongs to the next episode). next_values: (N,) V(s_T) to
    bootstrap the unfinished tail. By default every done is a termination (no bootstrap). To
    bootstrap time-limit truncations, pass ``terminated`` (T, N) and ``final_values`` (T, N), the
    value of the true last observation, read where ``dones & ~terminated``.
    ``discounts`` (T, N): the discount from step t to step t + 1 in place of ``gamma`` (action chunks:
    ``gamma ** k`` for a decision that executed k env steps, its reward already the discounted sum over
    them: the semi-MDP form of GAE over decisions); lambda still weighs one step (decision) each.
    Returns (advantages, returns), both (T, N), returns = advantages + values.
    """
    if (terminated is None) != (final_values is None):
        raise ValueError("pass terminated and final_values together (needed to bootstrap truncations)")
    num_steps = rewards.shape[0]
    done = dones.bool()
    term = done if terminated is None else terminated.bool()
    zero = torch.zeros_like(next_values)
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(next_values)
    for t in reversed(range(num_steps)):
        after = next_values if t == num_steps - 1 else values[t + 1]
        if final_values is not None:
            after = torch.where(done[t], final_values[t], after)
        after = torch.where(term[t], zero, after)
        g = gamma if discounts is None else discounts[t]
        delta = rewards[t] + g * after - values[t]
        running = delta + g * lam * (~done[t]).to(rewards.dtype) * running
        advantages[t] = running
    return advantages, advantages + values


def compute_token_gae(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """GAE over response tokens, (B, L) each; the token after the last response token is terminal.

    Masked-out positions are skipped (the recursion carries over them) and get advantage and
    return 0. Returns (advantages, returns), both (B, L), unwhitened.
    """
    mask = response_mask.bool()
    batch, length = token_rewards.shape
    running = torch.zeros(batch, dtype=token_rewards.dtype, device=token_rewards.device)
    next_value = torch.zeros_like(running)
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(length)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        running = torch.where(mask[:, t], candidate, running)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages[:, t] = running
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    advantages = torch.where(mask, advantages, zero)
    return advantages, torch.where(mask, advantages + values, zero)


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """(B, L) reward-to-go G_t = r_t + gamma * G_next over response tokens; 0 on masked positions."""
    mask = response_mask.bool()
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(mask[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return torch.where(mask, returns, torch.zeros((), dtype=returns.dtype, device=returns.device))


def grpo_outcome_advantage(
    scores: Tensor,
    *,
    group_index: Tensor | None = None,
    group_size: int | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """(B,) group-relative advantage (r - mean_g) / (std_g + eps) of outcome scores (B,).

    GRPO: Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300). With ``norm_by_std=False`` it is
    Dr. GRPO's unbiased variant r - mean_g (Liu et al. 2025, arXiv 2503.20783). Groups come from
    ``group_index`` (B,) ids or ``group_size`` contiguous samples; singletons get 0.
    """
    inverse, num_groups = group_inverse(scores.shape[0], group_index, group_size, scores.device)
    mean, std, _ = group_mean_std(scores, inverse, num_groups)
    advantages = scores - mean[inverse]
    if norm_by_std:
        advantages = advantages / (std[inverse] + eps)
    return _zero_uninformative(advantages, scores, inverse, num_groups)


def _zero_uninformative(advantages: Tensor, scores: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    """(B,) advantages with exact zeros for singleton and constant groups."""
    constant = group_is_constant(scores, inverse, num_groups)  # singletons are constant too
    return torch.where(constant[inverse], torch.zeros_like(advantages), advantages)


def rloo_advantage(
    scores: Tensor, *, group_index: Tensor | None = None, group_size: int | None = None
) -> Tensor:
    """(B,) leave-one-out advantage r_i - mean_{j != i in group} r_j (Ahmadian et al. 2024, arXiv 2402.14740).

    Equals K/(K-1) * (r_i - mean_g) for a group of K; singletons get 0.
    """
    inverse, num_groups = group_inverse(scores.shape[0], group_index, group_size, scores.device)
    sums, counts = group_sum_count(scores, inverse, num_groups)
    baseline = (sums[inverse] - scores) / (counts[inverse] - 1).clamp(min=1)
    return _zero_uninformative(scores - baseline, scores, inverse, num_groups)


def reinforce_pp_advantage(
    token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): reward-to-go whitened over the whole batch.

    token_rewards (B, L) already hold the outcome score on the last token and any per-token KL
    penalty. Returns (advantages, returns), both (B, L): returns are the discounted reward-to-go,
    advantages those returns whitened across all response tokens of the batch.
    """
    returns = discounted_returns(token_rewards, response_mask, gamma=gamma)
    return masked_whiten(returns, response_mask, eps=eps), returns


def group_baseline(
    scores: Tensor, *, group_index: Tensor | None = None, group_size: int | None = None
) -> Tensor:
    """(B,) scores minus their group mean (REINFORCE++-baseline's first step); singletons get 0."""
    inverse, num_groups = group_inverse(scores.shape[0], group_index, group_size, scores.device)
    mean, _, _ = group_mean_std(scores, inverse, num_groups)
    return _zero_uninformative(scores - mean[inverse], scores, inverse, num_groups)


def grpo_episode_advantage(
    rewards: Tensor,
    dones: Tensor,
    *,
    group_index: Tensor | None = None,
    group_size: int | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, Tensor]:
    """GRPO over embodied episodes: each env's episode return, normalised within its group.

    rewards, dones: (T, N). Each env contributes one episode: steps 0..its first done (all T
    steps if it never finishes; the rollout length acts as the time limit). Groups of envs
    (``group_index`` (N,) or ``group_size``) start from the same initial state. Returns
    (advantages (T, N), episode_returns (N,), step_mask (T, N)); steps after the first done
    belong to an unscored episode and have mask 0 and advantage 0.
    """
    num_steps = rewards.shape[0]
    steps = torch.arange(num_steps, device=rewards.device).unsqueeze(1)  # (T, 1)
    done = dones.bool()
    first_done = torch.where(done, steps, torch.full_like(steps, num_steps - 1)).min(dim=0).values  # (N,)
    step_mask = steps <= first_done.unsqueeze(0)  # (T, N)
    episode_returns = torch.where(step_mask, rewards, torch.zeros_like(rewards)).sum(dim=0)
    env_adv = grpo_outcome_advantage(
        episode_returns, group_index=group_index, group_size=group_size, norm_by_std=norm_by_std, eps=eps
    )
    advantages = torch.where(step_mask, env_adv.unsqueeze(0).expand_as(rewards), torch.zeros_like(rewards))
    return advantages, episode_returns, step_mask
