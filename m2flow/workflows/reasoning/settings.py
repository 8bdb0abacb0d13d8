"""Every reasoning worker's settings, and the flow's run settings, built in one place from the config, the
Plan and the run.

What the plan decides is read from the plan here and nowhere else: the generation mode, chunking and
``max_running`` (``generation``, ``prompts_per_chunk``, ``max_running``), when groups leave a continuous
turn (``emit``), the consumers' micro-batch sizes, who shares devices and offloads. The workers read their
settings; a fused component's settings go to the process that hosts it (``Workflow.launch_plan``). What the
flow reads that no plan decides (seed, steps, timeouts, evaluation) is ``ReasoningRun``, read once at launch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from m2flow.planner import Plan
from m2flow.workers.actor import ActorSettings
from m2flow.workers.config import plan_micro_batches
from m2flow.workers.generation import RolloutSettings
from m2flow.workers.inference import InferenceSettings
from m2flow.workers.config import RewardConfig
from m2flow.workers.reward import RewardSettings
from m2flow.runtime.streams import GroupStream
from m2flow.workflows.reasoning.config import ReasoningConfig


@dataclass(frozen=True, kw_only=True)
class ReasoningRun:
    """What the reasoning flow reads of the config: nothing the plan decides."""

    seed: int
    """seed of the data order"""
    steps: int
    """training iterations"""
    shuffle: bool
    """shuffle the prompts every epoch"""
    iteration_timeout_s: float | None
    """longest wait for an iteration's calls (None: no limit)"""
    eval_size: int | None
    """held-out prompts evaluated (None: all)"""
    eval_max_new_tokens: int
    """most tokens of a held-out response (the rollout's sampling limit)"""
    eval_stop: tuple[str, ...]
    """strings that end a held-out response (the rollout's)"""
    eval_reward: RewardConfig
    """how held-out responses are scored (the training reward, with ``eval_reward`` in place of its fn)"""
    partial: bool = False
    """partial rollouts (``rollout.partial``): over-provision the first iteration of a fresh run, save what is
    carried with a checkpoint and give it back on resume"""


def run_settings(cfg: ReasoningConfig) -> ReasoningRun:
    """The reasoning flow's run settings, from the config."""
    sampling = cfg.rollout.sampling
    return ReasoningRun(
        seed=cfg.seed, steps=cfg.steps, shuffle=cfg.data.shuffle,
        iteration_timeout_s=cfg.fault_tolerance.iteration_timeout_s, eval_size=cfg.eval_size,
        eval_max_new_tokens=sampling.max_new_tokens, eval_stop=tuple(sampling.stop),
        eval_reward=cfg.reward if cfg.eval_reward is None else replace(cfg.reward, fn=cfg.eval_reward),
        partial=cfg.rollout.partial)


class WorkerSettings(Protocol):
    """``worker_settings`` with the config and the plan bound (what a flow calls once its streams exist)."""

    def __call__(self, model_path: str, streams: dict[str, GroupStream], *, resume_dir: str | None = None,
                 counters: dict[str, int] | None = None, start_step: int = 0) -> dict[str, Any]: ...


def worker_settings(cfg: ReasoningConfig, plan: Plan, model_path: str, streams: dict[str, GroupStream], *,
                    resume_dir: str | None = None, counters: dict[str, int] | None = None,
                    start_step: int = 0) -> dict[str, Any]:
    """component -> its worker's settings. ``streams``: one per data edge the plan uses (``prompts``,
    ``scored``, and ``responses`` / ``ready`` where those run between groups)."""
    s = plan.settings
    scored = streams["scored"]
    ready = streams.get("ready", scored)  # without inference, scored groups go straight to the actor
    responses = streams.get("responses", scored)  # reward hosted in the rollout: it emits scored groups
    sampling = cfg.rollout.sampling
    continuous = s["generation"] == "continuous"
    return {
        "rollout": RolloutSettings(
            model_path=model_path, backend=cfg.rollout.backend, dtype=cfg.rollout.dtype, compile=cfg.rollout.compile,
            sampling=sampling, prompts=streams["prompts"], responses=responses, seed=cfg.seed,
            batching=s["generation"], max_running=s["max_running"] if continuous else cfg.rollout.max_running,
            prompts_per_chunk=None if continuous else s["prompts_per_chunk"],
            emit_each_group=s.get("emit", "each group") == "each group",
            shares_devices=plan["rollout"].shares_devices, offload=plan["rollout"].offload,
            partial=cfg.rollout.partial, max_staleness=cfg.algorithm.max_staleness,
            inflight_updates=cfg.rollout.inflight_updates),
        "reward": RewardSettings(reward=cfg.reward, max_new_tokens=sampling.max_new_tokens,
                                 dynamic_sampling=cfg.algorithm.dynamic_sampling, responses=responses, scored=scored),
        "inference": InferenceSettings(
            model_path=model_path, inference=cfg.inference, algo=cfg.algorithm, temperature=sampling.temperature,
            group_size=sampling.n, scored=scored, ready=ready, **plan_micro_batches(s, "inference", cfg.inference),
            shares_devices=plan["inference"].shares_devices, offload=plan["inference"].offload),
        "actor": ActorSettings(
            model_path=model_path, actor=cfg.actor, algo=cfg.algorithm, temperature=sampling.temperature,
            group_size=sampling.n, ready=ready, total_steps=cfg.steps, seed=cfg.seed,
            **plan_micro_batches(s, "actor", cfg.actor), max_staleness=int(s.get("max_staleness", 0)),
            shares_devices=plan["actor"].shares_devices, offload=plan["actor"].offload, resume_dir=resume_dir,
            counters=dict(counters or {}), start_step=start_step),
    }
