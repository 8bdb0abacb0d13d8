"""Messages between the embodied workers: one env rank's trajectory segment, and what a rollout reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Trajectory:
    """T steps of one env rank's n environments, time-major, as the actor trains on them.

    Episodes end with same-step autoreset: where ``terminated | truncated`` is set at step t,
    ``obs[t + 1]`` is already the first observation of the next episode.
    """

    env_rank: int
    iteration: int
    obs: np.ndarray
    """(T, n, *obs_shape): the (normalised) observations the policy acted on."""
    actions: np.ndarray
    """(T, n, *action_shape): the sampled actions, before any clipping to the action bounds; with action
    chunks (T, n, K, *action_shape), decision t's K actions."""
    rewards: np.ndarray
    """(T, n) float32: the rewards to learn from (scaled when reward normalisation is on); with action chunks
    the discounted sum over the env steps decision t executed."""
    terminated: np.ndarray
    """(T, n) bool: the episode reached a terminal state at step t (its successor has value 0)."""
    truncated: np.ndarray
    """(T, n) bool: the episode was cut at step t (time limit); bootstrap from ``final_obs``."""
    final_index: np.ndarray
    """(m, 2) int64: (t, env) of each step that ended by truncation alone."""
    final_obs: np.ndarray
    """(m, *obs_shape): the true last observation at each ``final_index``."""
    last_obs: np.ndarray
    """(n, *obs_shape): the observation after step T - 1, to bootstrap the unfinished tail."""
    policy_version: int = 0
    """the version of the weights that acted: the number of iterations the actor had trained on."""
    env_steps: np.ndarray | None = None
    """(T, n) int64: env steps decision t executed (action chunks: K, fewer where an episode ended inside
    the chunk); the discount from decision t to t + 1 is gamma ** env_steps[t]. None: one step each."""
    behaviour_logprobs: np.ndarray | None = None
    """(T, n) float32: the log-probability of each decision's actions (every token of a chunk together)
    under the weights that acted, as the rollout sampled them. None: not recorded (the MLP and CNN
    actor-critics sample from their action head alone); a stale trajectory's are then scored by the
    actor with its copy of those weights."""

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])


@dataclass
class InteractStats:
    """What one env rank reports about one iteration of interaction."""

    env_rank: int
    steps: int
    """env steps taken (T * n; with action chunks the steps the T * n decisions executed)."""
    episode_returns: list[float] = field(default_factory=list)
    """raw returns of the episodes that ended during the iteration, in the order they ended."""
    episode_lengths: list[int] = field(default_factory=list)
    busy_s: float = 0.0
    """seconds spent simulating and normalising (the env stage's busy time)."""
    policy_s: float = 0.0
    """seconds spent in policy inference inside this process (fused plans only)."""
    wait_s: float = 0.0
    """seconds spent waiting for actions from a rollout rank."""
    wall_s: float = 0.0
    lock_wait_s: float = 0.0
    """seconds spent waiting for a turn on devices shared with the actor (fused plans)."""
    norm_delta: dict | None = None
    """moments of the observation / return samples normalised this iteration, for cross-rank merging."""
    successes: list[float] = field(default_factory=list)
    """``is_success`` of the ended episodes, when the env reports it."""
    errors: int = 0
    """exceptions raised by an env's step or reset (each env reset and the run going on)."""
