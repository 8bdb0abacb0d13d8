"""The embodied workflow's plan constraints: what its config adds to the one plan builder, and what the planner needs to know.

The one builder (``planner.build``) decides devices, the fusion of the rollout into the env
processes, edges, turns and offloads (``Workflow.offload_settings``) from the graph; this workflow
adds its settings: the pipeline stages of every env rank and how many iterations the env ranks may
collect ahead of the actor (``max_staleness``), and what a placement must give the config (``check``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collections.abc import Mapping

from m2flow.driver.workflow import Tunable
from m2flow.envs import EnvConfig
from m2flow.planner import Plan
from m2flow.planner.setup import Workload
from m2flow.workflows.embodied.config import EmbodiedConfig

# An item is one env step of one env; every env rank steps envs_per_rank envs, in pipeline stages.
WORKLOAD = Workload(
    chain=("actor",),
    items=("envs_per_rank", "rollout_steps"),
    items_per_rank_of="env",
    loop=("env", "rollout"),
    loop_steps="rollout_steps",
    loop_items=("envs_per_rank",),
    stages="pipeline_stages",
    inputs={"rollout": ("observations",), "env": ("actions",), "actor": ("trajectories",)},
    weights=(("actor", "rollout"),),
    categories={"env": "env_step", "rollout": "rollout", "actor": "train"},
)



def stage_counts(cfg: EmbodiedConfig) -> tuple[int, ...]:
    """Pipeline stages worth trying: 1, 2, 4 and the config's own, those that divide an env rank's envs."""
    envs = cfg.env.num_envs
    return tuple(sorted({k for k in (1, 2, 4, cfg.pipeline_stages) if k <= envs and envs % k == 0}))


# The plan settings the search varies, and the config key of each.
TUNABLES = (Tunable("pipeline_stages", "pipeline_stages", stage_counts),)

def settings(cfg: EmbodiedConfig, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's settings: the pipeline stages of every env rank (the search's in place of the config's),
    the batch shape, and how many iterations the env ranks may collect ahead of the actor."""
    stages = values.get("pipeline_stages", cfg.pipeline_stages)
    if not 1 <= stages <= cfg.env.num_envs:  # as the config checks its own
        raise ValueError(f"pipeline_stages must be in [1, env.num_envs={cfg.env.num_envs}], got {stages}")
    return {"pipeline_stages": stages, "rollout_steps": cfg.rollout_steps,
            "envs_per_rank": cfg.env.num_envs, "minibatch_size": cfg.algorithm.minibatch_size,
            # iterations the env ranks may collect ahead of the actor (0: synchronous)
            "max_staleness": cfg.algorithm.max_staleness}


# ----------------------------------------------------------------------------- profiling and placement: auto

def profile_probes(cfg: EmbodiedConfig) -> list[dict[str, Any]]:
    """Call sizes to profile: env and policy steps of 1, 2 or 4 stages (envs per call), the actor's batch
    at the config's ``rollout_steps`` and half of it (while it still holds a minibatch)."""
    envs, t = cfg.env.num_envs, cfg.rollout_steps
    stages = sorted({k for k in (1, 2, 4) if k <= envs and envs % k == 0})
    steps = [s for s in dict.fromkeys((t, max(1, t // 2))) if s * envs >= cfg.algorithm.minibatch_size] or [t]
    n = max(len(stages), len(steps))
    return [{"pipeline_stages": stages[i % len(stages)], "rollout_steps": steps[i % len(steps)]} for i in range(n)]


def profile_length(cfg: EmbodiedConfig, iterations: int) -> dict[str, Any]:
    """``iterations`` iterations, synchronous (no staleness), no evaluation, no warm start (a profile prices the loop)."""
    steps = iterations * cfg.batch_size(cfg.placed()["env"].world_size) * cfg.policy.action_chunk
    return {"total_env_steps": steps, "eval_every": 0, "algorithm.max_staleness": 0, "policy.warm_start.demos": None}


def resumable(old: Plan, new: Plan) -> bool:
    """A checkpoint holds every env rank's envs and, unless fused, the rollout ranks' generators."""
    return old["env"].world_size == new["env"].world_size and (new.fused("rollout") or not old.fused("rollout"))


def model_bytes(checkpoint: Path | None) -> tuple[float, float]:
    """(the policy's weights, the actor's file: weights and optimizer state), from a checkpoint."""
    if checkpoint is None:
        return 0.0, 0.0
    from m2flow.workers.embodied.actor import ACTOR_FILE
    from m2flow.workers.state_file import load_state

    path = checkpoint / ACTOR_FILE
    weights = sum(t.numel() * t.element_size() for t in load_state(path)["policy"].values())
    return float(weights), float(path.stat().st_size)


def env_spaces(env: EnvConfig) -> tuple[Any, Any]:
    """The single-env observation and action spaces (``m2flow.envs.factory.env_spaces``)."""
    from m2flow.envs.factory import env_spaces as spaces_of

    return spaces_of(env)


def edge_bytes(cfg: EmbodiedConfig) -> dict[str, float]:
    """Bytes per env step on each data edge, from one env's spaces (float32 everywhere): an observation;
    an action with its value and log-prob; a trajectory step (observation, action, reward, done, value,
    log-prob)."""
    import numpy as np

    obs_space, act_space = env_spaces(cfg.env)
    obs = 4.0 * int(np.prod(obs_space.shape or (1,)))
    act = 4.0 * int(np.prod(act_space.shape or (1,)))
    return {"observations": obs, "actions": act + 8.0, "trajectories": obs + act + 16.0}
