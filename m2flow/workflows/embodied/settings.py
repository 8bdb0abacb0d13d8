"""Every embodied worker's settings, and the flow's run settings, built in one place from the config and
the Plan.

What the plan decides (pipeline stages, whether the policy runs in the env processes, shared devices
and offload, staleness) is read from the plan here and nowhere else; the workers read their settings.
What the flow reads that no plan decides (seed, length, timeouts, evaluation) is ``EmbodiedRun``, read
once at launch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from m2flow.envs import EnvConfig
from m2flow.models.policy_config import PolicyConfig

from m2flow.planner import Plan
from m2flow.workers.embodied.settings import EmbodiedActorSettings, EmbodiedEnvSettings, EmbodiedRolloutSettings
from m2flow.workflows.embodied.config import EmbodiedConfig


def worker_settings(cfg: EmbodiedConfig, plan: Plan, names: dict[str, str], spaces: tuple[Any, Any]) -> dict[str, Any]:
    """component -> its worker's settings (``names``: the groups' names; ``spaces``: one env's observation
    and action spaces)."""
    obs_space, act_space = spaces
    stages: int = plan.settings["pipeline_stages"]  # the plan's, not the config's: a plan file may change it
    ranks = {c.name: c.world_size for c in plan.components}
    fused = plan.fused("rollout")
    batch = cfg.batch_size(ranks["env"])
    return {
        "env": EmbodiedEnvSettings(
            env=replace(cfg.env, num_groups=stages, seed=cfg.seed), rollout_steps=cfg.rollout_steps,
            actor_group=names["actor"], actor_ranks=ranks["actor"],
            rollout_group=None if fused else names["rollout"], rollout_ranks=ranks["rollout"],
            shares_devices=plan["env"].shares_devices, offload=plan["env"].offload,
            imports=tuple(cfg.env_worker.imports), max_error_rate=cfg.env_worker.max_error_rate,
            reset_groups=cfg.algorithm.group_size if cfg.algorithm.advantage == "grpo" else 0,
            chunk=cfg.policy.action_chunk,
            chunk_discount=1.0 if cfg.algorithm.advantage == "grpo" else cfg.algorithm.gamma),
        "rollout": EmbodiedRolloutSettings(
            obs_space=obs_space, action_space=act_space, policy=cfg.policy, seed=cfg.seed, env_group=names["env"],
            env_ranks=ranks["env"],
            stages=stages, rollout_steps=cfg.rollout_steps, shares_devices=plan["rollout"].shares_devices,
            offload=plan["rollout"].offload),
        "actor": EmbodiedActorSettings(
            obs_space=obs_space, action_space=act_space, policy=cfg.policy, ppo=cfg.algorithm, actor=cfg.actor,
            env_group=names["env"],
            env_ranks=ranks["env"], total_iterations=cfg.iterations(ranks["env"]), seed=cfg.seed,
            shares_devices=plan["actor"].shares_devices, offload=plan["actor"].offload, batch_size=batch,
            max_staleness=plan.settings["max_staleness"]),
    }


@dataclass(frozen=True, kw_only=True)
class EmbodiedRun:
    """What the embodied flow reads of the config: nothing the plan decides."""

    seed: int
    """seed of the envs, the policy and the held-out episodes"""
    iteration_timeout_s: float | None
    """longest wait for an iteration's calls (None: no limit)"""
    env: EnvConfig
    """one env rank's envs as configured (the probe of the spaces and the held-out episodes)"""
    imports: tuple[str, ...]
    """modules imported before an env is built here (custom env ids)"""
    policy: PolicyConfig
    iterations: int
    """iterations to reach ``total_env_steps`` over the plan's env ranks"""
    batch_size: int
    """samples per iteration over the plan's env ranks"""
    return_window: int
    """finished episodes averaged in ``env/episode_return_recent``"""
    sync_normalization: bool
    """merge the env ranks' observation / reward statistics after every iteration"""
    eval_episodes: int
    """held-out episodes per evaluation"""


def run_settings(cfg: EmbodiedConfig, plan: Plan) -> EmbodiedRun:
    """The embodied flow's run settings, from the config (sized by the plan's env ranks)."""
    env_ranks = plan["env"].world_size
    return EmbodiedRun(
        seed=cfg.seed, iteration_timeout_s=cfg.fault_tolerance.iteration_timeout_s, env=cfg.env,
        imports=tuple(cfg.env_worker.imports), policy=cfg.policy, iterations=cfg.iterations(env_ranks),
        batch_size=cfg.batch_size(env_ranks), return_window=cfg.return_window,
        sync_normalization=cfg.env_worker.sync_normalization, eval_episodes=cfg.eval_episodes)


class WorkerSettings(Protocol):
    """``worker_settings`` with the config and the plan bound (what the flow calls once the groups are named)."""

    def __call__(self, names: dict[str, str], spaces: tuple[Any, Any]) -> dict[str, Any]: ...
