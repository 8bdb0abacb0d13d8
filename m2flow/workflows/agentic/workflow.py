"""The agentic RL workflow (``workflow: agentic``): its declaration, registered by name.

A language model acting over several turns in text environments and with tools, trained with GRPO (or
PPO with a critic) on its own tokens only. The graph (``graph.py``) declares the components; the
one plan builder decides how a config runs (env fused into the rollout or not, who
shares devices), with this workflow's settings; the flow (``flow.py``) is the live system one iteration
at a time; the driver runs the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m2flow.driver.registry import register_workflow
from m2flow.driver.workflow import CheckpointEval, EvalOptions, Launch, Workflow
from m2flow.planner import Plan
from m2flow.planner.partial import partial_notes, run_ahead
from m2flow.planner.setup import Workload
from m2flow.runtime.executors import Executor
from m2flow.workflows.agentic.config import AgenticConfig
from m2flow.workflows.agentic.graph import GRAPH

if TYPE_CHECKING:  # the flow (workers, models, torch) is imported when a run launches, not to plan one
    from m2flow.workflows.agentic.flow import AgenticFlow, Prepared

# An item is one episode; env and rollout alternate for up to max_turns rounds, then the actor trains.
WORKLOAD = Workload(
    chain=("actor",),
    items=("groups_per_step", "group_size"),
    loop=("env", "rollout"),
    loop_steps="max_turns",
    loop_items=("groups_per_step", "group_size"),
    inputs={"rollout": ("observations",), "env": ("actions",), "actor": ("trajectories",)},
    weights=(("actor", "rollout"),),
    categories={"env": "env_step", "rollout": "generate", "actor": "train"},
    run_ahead="run_ahead",
)


class AgenticWorkflow(Workflow):
    name = "agentic"
    schema = AgenticConfig
    graph = GRAPH
    help = "Agentic RL: a language model acting over several turns in text environments and with tools"

    def settings(self, cfg: AgenticConfig, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
        actor = cfg.actor
        micro = ({"actor_micro_batch_tokens": actor.micro_batch_tokens} if actor.micro_batch_tokens is not None
                 else {"actor_micro_batch": actor.micro_batch_size})  # the actor's micro-batches
        staleness = cfg.algorithm.max_staleness
        # run_ahead: the iterations the rollout plays ahead of the actor (one less with partial rollouts), what the
        # flow runs and the simulator plays
        return {"groups_per_step": cfg.episodes.groups_per_step, "group_size": cfg.episodes.group_size,
                "max_turns": cfg.rollout.max_turns, "max_staleness": staleness,
                "run_ahead": run_ahead(staleness, cfg.rollout.partial), **micro}

    def notes(self, cfg: AgenticConfig, plan: Plan) -> tuple[str, ...]:
        """With partial rollouts: the rollout plays one iteration less ahead, and how its turns are priced."""
        return partial_notes(cfg.rollout.partial, cfg.algorithm.max_staleness, "episodes")

    def workload(self) -> Workload:
        return WORKLOAD

    def warm_start(self, cfg: AgenticConfig) -> str | None:
        return "model.warm_start" if cfg.model.warm_start.steps else None

    def prepare(self, cfg: AgenticConfig, run_dir: Path) -> Prepared:
        """The model (built, then warm-started once, before any worker loads it)."""
        from m2flow.workflows.agentic.warm_start import prepare_task_model, warm_start_model

        path = prepare_task_model(cfg)
        if cfg.model.warm_start.steps:
            path = warm_start_model(cfg, path)
        from m2flow.workflows.agentic.flow import Prepared

        return Prepared(path)

    def launch(self, cfg: AgenticConfig, plan: Plan, executor: Executor, run: Launch) -> AgenticFlow:
        from functools import partial

        from m2flow.workflows.agentic.flow import AgenticFlow
        from m2flow.workflows.agentic.settings import run_settings, worker_settings

        return AgenticFlow(self, plan, executor, run, settings=run_settings(cfg),
                           workers=partial(worker_settings, cfg, plan))

    def profile_probes(self, cfg: AgenticConfig) -> list[dict[str, Any]]:
        """Batch sizes to profile: a quarter, half and all of ``groups_per_step``."""
        g = cfg.episodes.groups_per_step
        return [{"episodes.groups_per_step": s} for s in sorted({max(1, g // 4), max(1, g // 2), g})]

    def profile_length(self, cfg: AgenticConfig, iterations: int) -> dict[str, Any]:
        """``iterations`` iterations, no warm start and no held-out evaluation (a profile prices the loop)."""
        return {"steps": iterations, "model.warm_start.steps": 0, "eval_every": 0}

    def edge_bytes(self, cfg: AgenticConfig) -> dict[str, float]:
        """Bytes per episode on each data edge: a turn's text each way, and the trajectory's ids, masks and
        log-probs (8 + 8 + 8 + 4 bytes a token) on its way to the actor."""
        r = cfg.rollout
        return {"actions": 4.0 * r.max_turn_tokens, "observations": 4.0 * r.max_turn_tokens,
                "trajectories": 28.0 * (r.max_tokens + cfg.model.tiny.max_position_embeddings // 4)}

    def model_bytes(self, checkpoint: Path | None) -> tuple[float, float]:
        """(the policy's weight files, the whole checkpoint: weights, optimizer and schedule state)."""
        if checkpoint is None:
            return 0.0, 0.0
        from m2flow.workers.actor_files import ACTOR_DIR

        weights = sum(f.stat().st_size for f in (checkpoint / ACTOR_DIR).glob("*.safetensors"))
        return float(weights), float(sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file()))

    def evaluate_checkpoint(self, checkpoint: Path, options: EvalOptions) -> CheckpointEval:
        """The run's held-out evaluation of the saved policy, in this process (``evaluation.py``)."""
        from m2flow.workflows.agentic import evaluation

        cfg = evaluation.saved_config(checkpoint, options.overrides)
        episodes = cfg.eval_episodes if options.episodes is None else options.episodes
        results = evaluation.evaluate_saved(checkpoint, cfg, episodes)
        return CheckpointEval(results, evaluation.summary(checkpoint, cfg.env.name, episodes, results))


WORKFLOW = register_workflow(AgenticWorkflow())
