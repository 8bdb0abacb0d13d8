"""From the env ranks' trajectories to one PPO batch: old log-probs, values, GAE or GRPO advantages, flattened samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from m2flow.algorithms.advantages import compute_gae
from m2flow.algorithms.estimators import StepBatch, compute_advantages
from m2flow.algorithms.offpolicy import decoupled_ppo_weights
from m2flow.models.policies import ActorCritic
from m2flow.models.policy_types import Policy
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.messages import Trajectory
from m2flow.workers.embodied.ppo import PPOBatch, evaluate_actions


# Samples per forward pass when scoring a batch with a policy other than the actor-critic (the VLA):
# its activations over a whole iteration's batch at once would cost far more memory than they save time.
SCORE_CHUNK = 1024


def score(policy: Policy, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (B,) or (B, K) and values (B,) of ``actions`` at ``obs``, without gradients."""
    with torch.no_grad():
        if isinstance(policy, ActorCritic) or len(obs) <= SCORE_CHUNK:
            return evaluate_actions(policy, obs, actions)
        parts = [evaluate_actions(policy, obs[i:i + SCORE_CHUNK], actions[i:i + SCORE_CHUNK])
                 for i in range(0, len(obs), SCORE_CHUNK)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _values(policy: Policy, obs: torch.Tensor) -> torch.Tensor:
    if isinstance(policy, ActorCritic) or len(obs) <= SCORE_CHUNK:
        return policy.value(obs)
    return torch.cat([policy.value(obs[i:i + SCORE_CHUNK]) for i in range(0, len(obs), SCORE_CHUNK)])


def grpo_advantages(trajs: list[Trajectory], rewards: torch.Tensor, dones: torch.Tensor,
                    group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO over the iteration's episodes: (T, N) advantages and the (T, N) steps that belong to each env's
    first episode. The envs of the joined trajectories are grouped by their index over all env ranks
    (``group_size`` consecutive ones were reset with the same seed: ``m2flow.workers.embodied.env.group_seeds``)."""
    index = np.concatenate([t.env_rank * t.num_envs + np.arange(t.num_envs) for t in trajs]) // group_size
    out = compute_advantages("grpo", StepBatch(rewards=rewards, dones=dones,
                                               group_index=torch.from_numpy(index).to(rewards.device)))
    return out.advantages, out.mask


def decision_discounts(trajs: list[Trajectory], gamma: float, device: torch.device | str) -> torch.Tensor | None:
    """(T, N) discount from each decision to the next, ``gamma ** env_steps`` (action chunks: a decision
    that executed k env steps is k steps of discount away from the next one); None: one step each."""
    if all(t.env_steps is None for t in trajs):
        return None
    steps = np.concatenate([np.ones(t.rewards.shape, np.int64) if t.env_steps is None else t.env_steps
                            for t in trajs], axis=1)
    return torch.from_numpy(np.power(gamma, steps.astype(np.float64)).astype(np.float32)).to(device)


def build_batch(policy: Policy, trajs: list[Trajectory], cfg: PPOConfig,
                device: torch.device | str = "cpu",
                behaviour: Sequence[Policy | np.ndarray | None] | None = None) -> tuple[PPOBatch, dict[str, float]]:
    """Join trajectories along the env axis ((T, N) with N = all envs) and flatten to T * N samples.

    Old log-probabilities and values come from ``policy`` in one pass. Without ``behaviour`` it must
    hold the weights the rollout acted with. With ``behaviour`` (one entry per trajectory: the
    policy that acted, scored here, or the (T, n) joint log-probs it recorded as it acted
    (``Trajectory.behaviour_logprobs``), or None where that is ``policy`` itself) the old log-probs are the
    proximal policy's (``policy``) and the batch carries the decoupled-PPO weights pi_prox / pi_behav
    (``m2flow.algorithms.offpolicy``); values, and so GAE, are always ``policy``'s critic. GAE bootstraps time-limit truncations from V(true last observation) and
    treats terminations as value 0; with ``use_critic`` off, values are 0 and lambda 1, so the
    advantages are discounted returns. With action chunks a sample is a decision and GAE runs over
    decisions, discounted by ``gamma ** env_steps`` between them. Also returns batch-level metrics.
    """
    def joined(name: str) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([getattr(t, name) for t in trajs], axis=1)).to(device)

    obs, actions, rewards = joined("obs"), joined("actions"), joined("rewards")
    terminated, truncated = joined("terminated"), joined("truncated")
    T, N = rewards.shape
    flat_obs = obs.reshape(T * N, *obs.shape[2:])
    flat_actions = actions.reshape(T * N, *actions.shape[2:])
    final_values = torch.zeros(T, N, device=device)
    with torch.no_grad():
        logprobs, values = score(policy, flat_obs, flat_actions)
        values = values.view(T, N)
        if cfg.use_critic:
            last_obs = torch.from_numpy(np.concatenate([t.last_obs for t in trajs])).to(device)
            next_values = _values(policy, last_obs)
            offset = 0
            for t in trajs:
                if len(t.final_index):
                    idx = torch.from_numpy(t.final_index).to(device)
                    final_values[idx[:, 0], idx[:, 1] + offset] = _values(
                        policy, torch.from_numpy(t.final_obs).to(device))
                offset += t.num_envs
        else:
            values = torch.zeros_like(values)
            next_values = torch.zeros(N, device=device)
    keep = None
    if cfg.advantage == "grpo":
        advantages, keep = grpo_advantages(trajs, rewards, terminated | truncated, cfg.group_size)
        returns = advantages
    else:
        advantages, returns = compute_gae(
            rewards, values, terminated | truncated, next_values, gamma=cfg.gamma,
            lam=cfg.gae_lambda if cfg.use_critic else 1.0, terminated=terminated, final_values=final_values,
            discounts=decision_discounts(trajs, cfg.gamma, device))
    weights = None
    extra: dict[str, float] = {}
    if behaviour is not None and any(b is not None for b in behaviour):
        joint = logprobs if logprobs.dim() == 1 else logprobs.sum(-1)  # the weights are per action
        behaviour_logprobs = joint.view(T, N).clone()
        offset = 0
        with torch.no_grad():
            for t, b in zip(trajs, behaviour):
                cols = slice(offset, offset + t.num_envs)
                offset += t.num_envs
                if isinstance(b, np.ndarray):  # recorded by the rollout as it sampled
                    behaviour_logprobs[:, cols] = torch.from_numpy(b).to(device)
                elif b is not None:  # (T, n) samples of this trajectory, scored by the weights that acted
                    o, a = obs[:, cols], actions[:, cols]
                    lp, _ = score(b, o.reshape(-1, *o.shape[2:]), a.reshape(-1, *a.shape[2:]))
                    behaviour_logprobs[:, cols] = (lp if lp.dim() == 1 else lp.sum(-1)).view(T, -1)
        weights = decoupled_ppo_weights(joint, behaviour_logprobs.reshape(-1))
        extra = {"async/importance_weight_mean": float(weights.mean()),
                 "async/importance_weight_max": float(weights.max())}
    flat_values, flat_returns, flat_advantages = values.reshape(-1), returns.reshape(-1), advantages.reshape(-1)
    if keep is not None:  # only the steps of the scored episodes are trained on
        idx = keep.reshape(-1).nonzero().squeeze(1)
        flat_obs, flat_actions, logprobs = flat_obs[idx], flat_actions[idx], logprobs[idx]
        flat_values, flat_returns, flat_advantages = flat_values[idx], flat_returns[idx], flat_advantages[idx]
        weights = None if weights is None else weights[idx]
    var = flat_returns.var()
    explained = float(1.0 - (flat_returns - flat_values).var() / var) if var > 0 else float("nan")
    batch = PPOBatch(flat_obs, flat_actions, logprobs, flat_values, flat_advantages, flat_returns, weights)
    metrics = {
        "critic/explained_variance": explained,
        "critic/value_mean": float(flat_values.mean()),
        "actor/advantage_mean": float(flat_advantages.mean()),  # over the samples trained on
        "actor/batch_size": float(len(flat_advantages)),
        **extra,
    }
    return batch, metrics
