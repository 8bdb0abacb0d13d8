"""Every reasoning worker's settings, built in one place from the config, the Plan and the run.

What the plan decides is read from the plan here and nowhere else: the generation mode, chunking and
``max_running`` (``generation``, ``prompts_per_chunk``, ``max_running``), when groups leave a continuous
turn (``emit``), the consumers' micro-batch sizes, who shares devices and offloads. The workers read their
settings; a fused component's settings go to the process that hosts it (``Workflow.launch_plan``).
"""

from __future__ import annotations

from typing import Any

from m2flow.planner import Plan
from m2flow.workers.actor import ActorSettings
from m2flow.workers.config import plan_micro_batches
from m2flow.workers.generation import RolloutSettings
from m2flow.workers.inference import InferenceSettings
from m2flow.workers.reward import RewardSettings
from m2flow.runtime.streams import GroupStream
from m2flow.workflows.reasoning.config import ReasoningConfig


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
            shares_devices=plan["rollout"].shares_devices, offload=plan["rollout"].offload),
        "reward": RewardSettings(reward=cfg.reward, max_new_tokens=sampling.max_new_tokens,
                                 dynamic_sampling=cfg.algorithm.dynamic_sampling, responses=responses, scored=scored),
        "inference": InferenceSettings(
            model_path=model_path, inference=cfg.inference, algo=cfg.algorithm, temperature=sampling.temperature,
            group_size=sampling.n, scored=scored, ready=ready, **plan_micro_batches(s, "inference", cfg.inference),
            shares_devices=plan["inference"].shares_devices, offload=plan["inference"].offload),
        "actor": ActorSettings(
            model_path=model_path, actor=cfg.actor, algo=cfg.algorithm, temperature=sampling.temperature,
            group_size=sampling.n, ready=ready, total_steps=cfg.steps, seed=cfg.seed,
            **plan_micro_batches(s, "actor", cfg.actor), shares_devices=plan["actor"].shares_devices,
            offload=plan["actor"].offload, resume_dir=resume_dir, counters=dict(counters or {}),
            start_step=start_step),
    }
