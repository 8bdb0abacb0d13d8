"""Plain Python loop versions of the vectorised estimators and losses, written from the papers.

They work on nested lists of floats, one sample and one step at a time, and are deliberately
written in a different style from the tensor code (explicit episode resets, explicit lists of
valid positions) so that an error in one is unlikely to be repeated in the other.
"""

from __future__ import annotations

import math


def gae(rewards, values, dones, next_values, gamma, lam, terminated=None, final_values=None, discounts=None):
    """Time-major GAE; each env is walked backwards and the accumulator reset at episode ends.
    ``discounts[t][n]``, when given, is the discount after step t (in place of gamma)."""
    steps, envs = len(rewards), len(rewards[0])
    adv = [[0.0] * envs for _ in range(steps)]
    for n in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if discounts is not None:
                gamma = discounts[t][n]
            if dones[t][n]:
                running = 0.0  # nothing after the end of an episode flows back into it
                truncated = terminated is not None and not terminated[t][n]
                after = final_values[t][n] if truncated else 0.0
            else:
                after = next_values[n] if t == steps - 1 else values[t + 1][n]
            delta = rewards[t][n] + gamma * after - values[t][n]
            running = delta + gamma * lam * running
            adv[t][n] = running
    returns = [[adv[t][n] + values[t][n] for n in range(envs)] for t in range(steps)]
    return adv, returns


def token_gae(rewards, values, mask, gamma, lam):
    """GAE per row over the list of valid positions only; invalid positions get 0."""
    adv = [[0.0] * len(row) for row in rewards]
    ret = [[0.0] * len(row) for row in rewards]
    for b, row_mask in enumerate(mask):
        valid = [t for t, m in enumerate(row_mask) if m]
        running, next_value = 0.0, 0.0
        for t in reversed(valid):
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            running = delta + gamma * lam * running
            adv[b][t] = running
            ret[b][t] = running + values[b][t]
            next_value = values[b][t]
    return adv, ret


def _groups(ids):
    members: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    return members


def grpo(scores, ids, norm_by_std=True, eps=1e-6):
    out = [0.0] * len(scores)
    for idx in _groups(ids).values():
        if len(idx) < 2:
            continue
        vals = [scores[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out


def rloo(scores, ids):
    out = [0.0] * len(scores)
    for idx in _groups(ids).values():
        if len(idx) < 2:
            continue
        for i in idx:
            others = [scores[j] for j in idx if j != i]
            out[i] = scores[i] - sum(others) / len(others)
    return out


def returns_to_go(rewards, mask, gamma):
    out = [[0.0] * len(row) for row in rewards]
    for b, row_mask in enumerate(mask):
        running = 0.0
        for t in reversed([t for t, m in enumerate(row_mask) if m]):
            running = rewards[b][t] + gamma * running
            out[b][t] = running
    return out


def whiten(values, mask, eps):
    flat = [values[b][t] for b in range(len(values)) for t in range(len(values[b])) if mask[b][t]]
    mean = sum(flat) / len(flat)
    var = sum((v - mean) ** 2 for v in flat) / (len(flat) - 1) if len(flat) > 1 else 0.0
    constant = max(flat) == min(flat)  # equal values whiten to exact zeros
    return [
        [(values[b][t] - mean) / math.sqrt(var + eps) if mask[b][t] and not constant else 0.0
         for t in range(len(values[b]))]
        for b in range(len(values))
    ]


def last_token_rewards(scores, mask):
    rewards = [[0.0] * len(row) for row in mask]
    for b, row in enumerate(mask):
        valid = [t for t, m in enumerate(row) if m]
        if valid:
            rewards[b][valid[-1]] = scores[b]
    return rewards


def reinforce_pp(token_rewards, mask, gamma, eps=1e-8):
    ret = returns_to_go(token_rewards, mask, gamma)
    return whiten(ret, mask, eps), ret


def reinforce_pp_baseline(scores, ids, mask, gamma, eps=1e-8, kl=None, kl_coef=0.0):
    centred = list(scores)
    for idx in _groups(ids).values():
        mean = sum(scores[i] for i in idx) / len(idx)
        for i in idx:
            centred[i] = scores[i] - mean if len(idx) > 1 else 0.0
    rewards = last_token_rewards(centred, mask)
    if kl is not None:
        rewards = [[r - kl_coef * k for r, k in zip(rr, kk)] for rr, kk in zip(rewards, kl)]
    return reinforce_pp(rewards, mask, gamma, eps)


def grpo_episodes(rewards, dones, ids, norm_by_std=True, eps=1e-6):
    steps, envs = len(rewards), len(rewards[0])
    returns, last = [], []
    for n in range(envs):
        total, end = 0.0, steps - 1
        for t in range(steps):
            total += rewards[t][n]
            if dones[t][n]:
                end = t
                break
        returns.append(total)
        last.append(end)
    per_env = grpo(returns, ids, norm_by_std, eps)
    adv = [[per_env[n] if t <= last[n] else 0.0 for n in range(envs)] for t in range(steps)]
    mask = [[t <= last[n] for n in range(envs)] for t in range(steps)]
    return adv, returns, mask


def ppo_token_loss(logp, old, a, clip_low, clip_high, clip_c=None):
    ratio = math.exp(logp - old)
    loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
    if clip_c is not None and a < 0:
        loss = min(loss, -a * clip_c)
    return loss


def decoupled_ppo_token_loss(logp, prox, behav, a, clip_low, clip_high, cap=None, clip_c=None):
    """One token of decoupled PPO: the behaviour weight times the PPO loss clipped against the proximal policy."""
    weight = math.exp(prox - behav)
    if cap is not None and weight > cap:
        weight = cap
    ratio = math.exp(logp - prox)
    low, high = 1 - clip_low, 1 + clip_high
    clipped_ratio = low if ratio < low else (high if ratio > high else ratio)
    surrogate = min(ratio * a, clipped_ratio * a)  # the objective to maximise
    if clip_c is not None and a < 0:
        surrogate = max(surrogate, clip_c * a)
    return -weight * surrogate


def aggregate(loss, mask, mode, norm_length=None):
    rows = [[loss[b][t] for t in range(len(loss[b])) if mask[b][t]] for b in range(len(loss))]
    rows = [r for r in rows if r]  # sequences with no token do not count
    if not rows:
        return 0.0
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum-norm":
        return sum(sum(r) for r in rows) / (len(rows) * (norm_length or len(loss[0])))
    raise ValueError(mode)
