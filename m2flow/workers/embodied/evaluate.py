"""Evaluation of an embodied policy: whole episodes with deterministic actions and frozen statistics.

Runs in the calling process (no workers): the training run's driver between iterations, or on a
saved checkpoint. Observations are normalised with the training statistics, which are not updated;
the returns reported are the environments' raw episode returns.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from m2flow.envs import EnvConfig, VecEnv
from m2flow.models.policy_config import PolicyConfig
from m2flow.workers.embodied.env_state import load_env_state
from m2flow.workers.embodied.inference import PolicyEngine
from m2flow.workers.state_file import load_state

EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes never replay the training envs' seeds


def evaluate_policy(
    env: EnvConfig,
    policy: PolicyConfig,
    weights: dict[str, torch.Tensor],
    normalizer_state: dict[str, Any] | None,
    episodes: int = 10,
    seed: int = 0,
    deterministic: bool = True,
    max_steps: int = 1_000_000,
) -> dict[str, float]:
    """Mean / std / min / max raw return and mean length over ``episodes`` finished episodes, and their
    success rate (``eval/success``) where the env reports ``is_success`` (``env.info_keys``)."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    cfg = replace(env, num_envs=min(env.num_envs, episodes), num_groups=1, seed=seed + EVAL_SEED_OFFSET)
    vec = VecEnv(cfg)
    try:
        if normalizer_state is not None:
            vec.load_state_dict(normalizer_state, stats_only=True)
        vec.set_training(False)
        engine = PolicyEngine(vec.single_observation_space, vec.single_action_space, policy, seed, [0])
        engine.load_weights(weights)
        obs = vec.reset()
        returns: list[float] = []
        lengths: list[int] = []
        successes: list[float] = []
        success_key = "is_success" if "is_success" in env.info_keys else None
        steps = 0
        while len(returns) < episodes and steps < max_steps:
            actions = engine.act(obs, 0, deterministic=deterministic)
            # action chunks: each env executes its chunk (the returns are the episodes' own, undiscounted)
            res = vec.step(actions) if policy.action_chunk == 1 else vec.step_chunk(actions)
            obs = res.obs
            steps += vec.num_envs if res.env_steps is None else int(res.env_steps.sum())
            returns.extend(res.episode_return.tolist())
            lengths.extend(res.episode_length.tolist())
            if success_key is not None and res.episode_env.size:
                successes.extend(res.infos[success_key][res.episode_env].tolist())  # whole-vector indices
    finally:
        vec.close()
    if not returns:
        return {"eval/episodes": 0.0}
    returns, lengths = returns[:episodes], lengths[:episodes]
    success = {"eval/success": float(np.mean(successes[:episodes]))} if successes else {}
    return success | {
        "eval/return": float(np.mean(returns)),
        "eval/return_std": float(np.std(returns)),
        "eval/return_min": float(np.min(returns)),
        "eval/return_max": float(np.max(returns)),
        "eval/length": float(np.mean(lengths)),
        "eval/episodes": float(len(returns)),
    }


def load_checkpoint_parts(directory: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The policy weights and env rank 0's normalisation statistics saved in a checkpoint."""
    directory = Path(directory)
    actor = load_state(directory / "actor.pt", map_location="cpu")
    env_state = load_env_state(directory, 0)
    return actor["policy"], env_state["vec"]
