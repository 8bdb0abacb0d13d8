"""Every agentic worker's settings, and the flow's run settings, built in one place from the config, the
Plan and the run.

The plan decides whether the environments run in env workers of their own or inside the rollout's
processes (``env`` fused into ``rollout``: then the rollout hosts them with the env settings), who shares
devices and offloads; the workers read their settings, never the config. What the flow reads that no plan
decides (steps, timeouts, env restarts, evaluation) is ``AgenticRun``, read once at launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from m2flow.planner import Plan
from m2flow.workers.agentic.env_worker import EnvSettings
from m2flow.workers.agentic.episode import EpisodeConfig
from m2flow.workers.agentic.rollout_worker import AgenticRolloutSettings
from m2flow.workers.actor import ActorSettings
from m2flow.workers.config import plan_micro_batches
from m2flow.runtime.streams import GroupStream
from m2flow.workflows.agentic.config import AgenticConfig


def env_settings(cfg: AgenticConfig, env_ranks: int, kwargs: dict[str, Any] | None = None) -> EnvSettings:
    """What each env worker holds: enough environments for its share of an iteration's episodes; with partial
    rollouts, and the carried ones too (one iteration's worth, which may all sit on one worker)."""
    per_step = cfg.episodes.groups_per_step * cfg.episodes.group_size
    carried = per_step if cfg.rollout.partial else 0
    return EnvSettings(name=cfg.env.name, kwargs=dict(cfg.env.kwargs if kwargs is None else kwargs),
                       num_envs=math.ceil(per_step / env_ranks) + carried, step_timeout_s=cfg.env.step_timeout_s,
                       max_error_rate=cfg.env.max_error_rate, concurrent=cfg.env.concurrent,
                       imports=tuple(cfg.env.imports), tool_format=cfg.rollout.tool_format)


def episode_config(cfg: AgenticConfig) -> EpisodeConfig:
    """How episodes are played: budgets, sampling, templates, the run's seed."""
    r = cfg.rollout
    return EpisodeConfig(max_turns=r.max_turns, max_tokens=r.max_tokens, max_turn_tokens=r.max_turn_tokens,
                         temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, stop=tuple(r.stop),
                         prompt_template=r.prompt_template, observation_template=r.observation_template,
                         seed=cfg.seed, reuse_kv=r.reuse_kv, tool_format=r.tool_format)


def worker_settings(cfg: AgenticConfig, plan: Plan, model_path: str, trajectories: GroupStream, env_ranks: int, *,
                    resume_dir: str | None = None, counters: dict[str, int] | None = None,
                    start_step: int = 0) -> dict[str, Any]:
    """component -> its worker's settings (``env_ranks``: env workers, or rollout ranks hosting the envs)."""
    r = cfg.rollout
    actor = cfg.actor
    return {
        "env": env_settings(cfg, env_ranks),
        "rollout": AgenticRolloutSettings(model_path=model_path, backend=r.backend, dtype=r.dtype,
                                          episode=episode_config(cfg), trajectories=trajectories, seed=cfg.seed,
                                          compile=r.compile, shares_devices=plan["rollout"].shares_devices,
                                          offload=plan["rollout"].offload, partial=r.partial,
                                          max_staleness=cfg.algorithm.max_staleness),
        "actor": ActorSettings(model_path=model_path, actor=actor, algo=cfg.algorithm, temperature=r.temperature,
                               group_size=cfg.episodes.group_size, ready=trajectories, total_steps=cfg.steps,
                               seed=cfg.seed,
                               **plan_micro_batches(plan.settings, "actor", actor),
                               max_staleness=int(plan.settings.get("max_staleness", 0)),
                               shares_devices=plan["actor"].shares_devices, offload=plan["actor"].offload,
                               resume_dir=resume_dir, counters=dict(counters or {}), start_step=start_step),
    }


@dataclass(frozen=True, kw_only=True)
class AgenticRun:
    """What the agentic flow reads of the config: nothing the plan decides."""

    steps: int
    """training iterations"""
    iteration_timeout_s: float | None
    """longest wait for an iteration's calls (None: no limit)"""
    seed_offset: int
    """training seeds are seed_offset + a running count"""
    env_timeout_s: float | None
    """longest wait for one env worker's call before it counts as lost (None: no limit)"""
    max_env_restarts: int
    """env workers launched again before a lost one fails the run"""
    eval_episodes: int
    """held-out episodes per evaluation"""
    eval_temperature: float
    """sampling temperature of the held-out evaluation"""
    eval_env: EnvSettings
    """the held-out environments (one worker's worth, with the evaluation's env settings)"""
    partial: bool = False
    """partial rollouts (``rollout.partial``): over-provision the first iteration of a fresh run, run one
    iteration less ahead, save the carried task instances in a checkpoint"""
    async_steps: bool = False
    """``env.async_steps``: the turn loop goes on with the episodes whose env workers have answered"""


def run_settings(cfg: AgenticConfig) -> AgenticRun:
    """The agentic flow's run settings, from the config."""
    return AgenticRun(
        steps=cfg.steps, iteration_timeout_s=cfg.fault_tolerance.iteration_timeout_s,
        seed_offset=cfg.episodes.seed_offset, env_timeout_s=cfg.env.worker_timeout_s,
        max_env_restarts=cfg.env.max_worker_restarts, eval_episodes=cfg.eval_episodes,
        eval_temperature=cfg.rollout.eval_temperature,
        eval_env=env_settings(cfg, 1, {**cfg.env.kwargs, **cfg.env.eval_kwargs}), partial=cfg.rollout.partial,
        async_steps=cfg.env.async_steps)


class WorkerSettings(Protocol):
    """``worker_settings`` with the config and the plan bound (what a flow calls once its streams exist)."""

    def __call__(self, model_path: str, trajectories: GroupStream, env_ranks: int, *, resume_dir: str | None = None,
                 counters: dict[str, int] | None = None, start_step: int = 0) -> dict[str, Any]: ...
