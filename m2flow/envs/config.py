"""The env config: which simulator, how many copies per worker, how they split into pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m2flow.config import option


@dataclass
class EnvConfig:
    """One env worker's vector of environments and its normalisation pipeline."""

    env_id: str = option(
        "HalfCheetah-v5",
        "registered gymnasium id; ManiSkill id with backend 'maniskill'; with backend 'metaworld' a task "
        "('reach-v3'), a comma-separated task list or a family ('mt3', 'mt10'), env i running task i mod len",
    )
    backend: str = option("gymnasium", "how single envs are built: 'gymnasium', 'maniskill' or 'metaworld'")
    num_envs: int = option(8, "environments per env-worker rank")
    num_groups: int = option(1, "pipeline stages: the envs split into this many independently stepped groups")
    seed: int = option(0, "base seed; env i of rank r is seeded with seed + r * num_envs + i")
    normalize_obs: bool = option(True, "normalise observations by running mean/std (SB3 VecNormalize)")
    normalize_reward: bool = option(True, "scale rewards by the running std of the discounted return")
    clip_obs: float = option(10.0, "normalised observations are clipped to [-clip_obs, clip_obs]")
    clip_reward: float = option(10.0, "scaled rewards are clipped to [-clip_reward, clip_reward]")
    gamma: float = option(0.99, "discount of the return whose std scales rewards (match the learner's)")
    norm_epsilon: float = option(1e-8, "added to variances before the square root")
    clip_actions: bool = option(True, "clip continuous actions to the action space bounds before stepping")
    max_episode_steps: int | None = option(None, "override the registered time limit (None keeps it)")
    env_kwargs: dict[str, Any] = option({}, "extra keyword arguments for the env constructor")
    info_keys: list[str] = option([], "info entries gathered into per-step arrays, e.g. ['is_success']")

    def validate(self) -> None:
        """Raise ValueError naming the field for impossible values."""
        if not self.env_id:
            raise ValueError("env_id: must not be empty")
        if self.num_envs < 1:
            raise ValueError(f"num_envs: must be >= 1, got {self.num_envs}")
        if not 1 <= self.num_groups <= self.num_envs:
            raise ValueError(
                f"num_groups: must be in [1, num_envs={self.num_envs}], got {self.num_groups}"
            )
        if self.clip_obs <= 0:
            raise ValueError(f"clip_obs: must be > 0, got {self.clip_obs}")
        if self.clip_reward <= 0:
            raise ValueError(f"clip_reward: must be > 0, got {self.clip_reward}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma: must be in [0, 1], got {self.gamma}")
        if self.norm_epsilon <= 0:
            raise ValueError(f"norm_epsilon: must be > 0, got {self.norm_epsilon}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps: must be >= 1 or None, got {self.max_episode_steps}")
