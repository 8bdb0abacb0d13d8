"""The message an env group returns per step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepResult:
    """One step of ``n`` environments (a pipeline group or the whole vector), after normalisation.

    Episodes end with same-step autoreset: where one ended, ``obs`` already holds the first
    observation of the next episode and ``next_obs`` the true last observation of the ended one.
    """

    obs: np.ndarray
    """(n, *obs_shape): what the policy acts on next; float32 (pixel uint8 unchanged)."""
    next_obs: np.ndarray
    """(n, *obs_shape): true successor of this step's state; equals ``obs`` where no episode ended."""
    reward: np.ndarray
    """(n,) float32: the reward to learn from (scaled when reward normalisation is on)."""
    raw_reward: np.ndarray
    """(n,) float64: the environment's own reward."""
    terminated: np.ndarray
    """(n,) bool: the episode reached a terminal state; its value is 0, never bootstrap."""
    truncated: np.ndarray
    """(n,) bool: the episode was cut (time limit); bootstrap from V(next_obs) unless terminated."""
    episode_return: np.ndarray
    """(d,) float64: undiscounted raw returns of the d episodes that ended at this step."""
    episode_length: np.ndarray
    """(d,) int64: lengths of the episodes that ended at this step."""
    episode_env: np.ndarray
    """(d,) int64: worker-local indices of the envs whose episodes ended."""
    group: int = -1
    """The pipeline group that stepped (-1: several groups joined)."""
    infos: dict[str, np.ndarray] = field(default_factory=dict)
    """Per-env arrays (n,) of the configured ``info_keys`` (NaN where an env did not report one)."""
    env_steps: np.ndarray | None = None
    """(n,) int64: env steps each env executed (a chunk of actions: fewer than the chunk where its episode
    ended inside it); None: one each."""

    @property
    def done(self) -> np.ndarray:
        """(n,) bool: an episode ended (terminated or truncated)."""
        return self.terminated | self.truncated

    @property
    def bootstrap(self) -> np.ndarray:
        """(n,) bool: ended by truncation alone, so the return continues past ``next_obs``."""
        return self.truncated & ~self.terminated

    @staticmethod
    def concatenate(parts: list[StepResult]) -> StepResult:
        """Join the results of consecutive groups into one result over all their envs."""
        keys = parts[0].infos.keys()
        return StepResult(
            obs=np.concatenate([p.obs for p in parts]),
            next_obs=np.concatenate([p.next_obs for p in parts]),
            reward=np.concatenate([p.reward for p in parts]),
            raw_reward=np.concatenate([p.raw_reward for p in parts]),
            terminated=np.concatenate([p.terminated for p in parts]),
            truncated=np.concatenate([p.truncated for p in parts]),
            episode_return=np.concatenate([p.episode_return for p in parts]),
            episode_length=np.concatenate([p.episode_length for p in parts]),
            episode_env=np.concatenate([p.episode_env for p in parts]),
            group=-1,
            infos={k: np.concatenate([p.infos[k] for p in parts]) for k in keys},
            env_steps=None if parts[0].env_steps is None else np.concatenate([p.env_steps for p in parts]),
        )
