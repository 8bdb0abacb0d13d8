"""A multi-turn trajectory as one message, and a batch of them in the layout the actor trains on.

A trajectory is the first observation (the prompt) followed by one flat response: model turns with
the observations between them. ``action_mask`` marks the tokens the policy generated (1) apart from
observation and tool-output tokens (0); only the former carry log-probs and loss. ``to_rollout_batch``
lays trajectories out as a ``RolloutBatch`` whose ``response_mask`` covers every response token (the
model attends to observations) and whose ``action_mask`` is the loss mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from m2flow.data.batch import RolloutBatch, left_pad, right_pad

FinishReason = Literal["terminated", "truncated", "turn_budget", "token_budget", "env_error"]
"""Why an episode ended: the task ended it, the environment's own limit did, the rollout's turn budget or
token budget ran out, or the environment failed (raised, hung, returned a bad value)."""

BUDGET_REASONS: tuple[FinishReason, ...] = ("truncated", "turn_budget", "token_budget")
"""Finish reasons that cut an episode short rather than end it."""


@dataclass
class Trajectory:
    """One episode of one environment: token ids, masks, log-probs and rewards, turn by turn."""

    traj_id: int
    """Unique within a run (the caller numbers them): the key that nothing is lost or duplicated."""
    env_index: int
    """The environment (in its batch) that played the episode."""
    seed: int
    """The seed the environment was reset with."""
    group_id: int
    """Trajectories of the same seed/prompt share it (GRPO groups)."""
    prompt_ids: list[int]
    """Token ids of the first observation."""
    response_ids: list[int] = field(default_factory=list)
    """Every token after the prompt: model turns and observations, in order."""
    action_mask: list[int] = field(default_factory=list)
    """Per response token: 1 if the policy generated it, 0 for observation and tool tokens."""
    logprobs: list[float] = field(default_factory=list)
    """Per response token: the generator's log-prob of a policy token, 0.0 elsewhere."""
    turn_rewards: list[float] = field(default_factory=list)
    """The environment's reward for each model turn it stepped on."""
    turn_ends: list[int] = field(default_factory=list)
    """Per entry of `turn_rewards`: the index in `response_ids` of that turn's last model token."""
    turn_texts: list[str] = field(default_factory=list)
    """The decoded text of each model turn (what the environment was given)."""
    versions: list[int] = field(default_factory=list)
    """Per response token: the policy version playing when it was added (partial rollouts train an episode
    whose turns span weight versions; ``to_rollout_batch(per_token_versions=True)``)."""
    num_turns: int = 0
    """Model turns taken."""
    finish_reason: FinishReason = "terminated"
    error: str = ""
    """The environment's failure, when `finish_reason` is 'env_error'."""

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its turn rewards."""
        return float(sum(self.turn_rewards))

    @property
    def model_tokens(self) -> int:
        return int(sum(self.action_mask))

    @property
    def model_versions(self) -> list[int]:
        """The policy version of each model token, in order (observation tokens left out)."""
        return [v for v, m in zip(self.versions, self.action_mask) if m]

    @property
    def observation_tokens(self) -> int:
        return len(self.response_ids) - self.model_tokens

    def token_rewards(self) -> list[float]:
        """Per response token: each turn's reward on that turn's last model token, 0 elsewhere."""
        out = [0.0] * len(self.response_ids)
        for pos, r in zip(self.turn_ends, self.turn_rewards):
            out[pos] += r
        return out


def to_rollout_batch(trajectories: Sequence[Trajectory], pad_id: int, per_token_versions: bool = False) -> RolloutBatch:
    """The trajectories that hold at least one model token as a padded batch: prompts (B, Lp) left-padded,
    responses (B, Lr) right-padded, ``action_mask`` (B, Lr) the loss mask, ``rollout_logprobs`` (B, Lr),
    ``rewards`` (B,) the returns, ``group_ids`` (B,), ``truncated`` (B,) cut short by a budget or limit;
    ``meta`` lists ``traj_id``, ``num_turns``, ``finish_reason`` and ``token_rewards`` per row. Trajectories
    without a model token (an environment that failed at reset) carry no loss and are left out.
    ``per_token_versions``: ``token_versions`` (B, Lr) holds each token's policy version (partial rollouts)."""
    rows = [t for t in trajectories if t.model_tokens > 0]
    if not rows:
        raise ValueError("no trajectory holds a model token")
    prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in rows], pad_id)
    batch = RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=right_pad([t.response_ids for t in rows], pad_id),
        response_mask=right_pad([[1] * len(t.response_ids) for t in rows], 0),
        action_mask=right_pad([t.action_mask for t in rows], 0),
        group_ids=torch.tensor([t.group_id for t in rows], dtype=torch.long),
        truncated=torch.tensor([t.finish_reason in BUDGET_REASONS for t in rows], dtype=torch.bool),
        pad_id=pad_id,
        rewards=torch.tensor([t.reward for t in rows], dtype=torch.float32),
        rollout_logprobs=right_pad([t.logprobs for t in rows], 0.0, dtype=torch.float32),
        meta={"traj_id": [t.traj_id for t in rows], "num_turns": [t.num_turns for t in rows],
              "finish_reason": [t.finish_reason for t in rows], "token_rewards": [t.token_rewards() for t in rows]},
    )
    if per_token_versions:
        batch.token_versions = right_pad([t.versions for t in rows], 0)
    return batch
