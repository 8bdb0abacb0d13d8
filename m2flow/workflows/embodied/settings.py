"""Every embodied worker's settings, built in one place from the config and the Plan.

What the plan decides (pipeline stages, whether the policy runs in the env processes, shared devices
and offload, staleness) is read from the plan here and nowhere else; the workers read their settings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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
            reset_groups=cfg.algorithm.group_size if cfg.algorithm.advantage == "grpo" else 0),
        "rollout": EmbodiedRolloutSettings(
            obs_space=obs_space, action_space=act_space, policy=cfg.policy, seed=cfg.seed, env_group=names["env"], env_ranks=ranks["env"],
            stages=stages, rollout_steps=cfg.rollout_steps, shares_devices=plan["rollout"].shares_devices,
            offload=plan["rollout"].offload),
        "actor": EmbodiedActorSettings(
            obs_space=obs_space, action_space=act_space, policy=cfg.policy, ppo=cfg.algorithm, actor=cfg.actor,
            env_group=names["env"],
            env_ranks=ranks["env"], total_iterations=cfg.iterations(ranks["env"]), seed=cfg.seed,
            shares_devices=plan["actor"].shares_devices, offload=plan["actor"].offload, batch_size=batch,
            max_staleness=plan.settings["max_staleness"]),
    }
