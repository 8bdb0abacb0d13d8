"""The embodied RL workflow (``workflow: embodied``): its declaration, registered by name.

PPO on vectorised simulators with env, rollout and actor workers. The graph (``graph.py``) declares
the components, ``plan.py`` holds the constraints its config adds to the one plan builder, the flow (``flow.py``) is
the live system one iteration at a time; the driver runs the loop. ``prepare`` runs the behaviour-cloning warm
start (``warm_start.py``) when ``policy.warm_start.demos`` is set; the workers start from its weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m2flow.driver.registry import register_workflow
from m2flow.driver.workflow import CheckpointEval, EvalOptions, Launch, Workflow
from m2flow.planner import Plan
from m2flow.runtime.executors import Executor
from m2flow.workflows.embodied import plan as planning
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.embodied.graph import GRAPH

if TYPE_CHECKING:  # the flow (workers, models, torch) is imported when a run launches, not to plan one
    from m2flow.workflows.embodied.flow import EmbodiedFlow


class EmbodiedWorkflow(Workflow):
    name = "embodied"
    schema = EmbodiedConfig
    graph = GRAPH
    help = "Embodied RL: PPO on vectorised simulators with env, rollout and actor workers"
    tunables = planning.TUNABLES

    def settings(self, cfg: EmbodiedConfig, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
        return planning.settings(cfg, plan, values)

    def check(self, cfg: EmbodiedConfig, plan: Plan) -> None:
        cfg.check_ranks({c.name: c.world_size for c in plan.components})

    def workload(self) -> Any:
        return planning.WORKLOAD

    def offload_settings(self, cfg: EmbodiedConfig) -> dict[str, bool]:
        return {"rollout": cfg.rollout.offload, "actor": cfg.actor.offload}

    def warm_start(self, cfg: EmbodiedConfig) -> str | None:
        return "policy.warm_start" if cfg.policy.warm_start.demos is not None else None

    def warm_started(self, prepared: Path) -> Path:
        return prepared

    def prepare(self, cfg: EmbodiedConfig, run_dir: Path) -> Path | None:
        """The behaviour-cloned policy's file (trained once, or reused), or None without ``policy.warm_start.demos``."""
        if cfg.policy.warm_start.demos is None:
            return None
        from m2flow.workflows.embodied.warm_start import warm_start_policy

        return warm_start_policy(cfg, Path(run_dir))

    def launch(self, cfg: EmbodiedConfig, plan: Plan, executor: Executor, run: Launch) -> EmbodiedFlow:
        from dataclasses import replace
        from functools import partial

        from m2flow.workflows.embodied.flow import EmbodiedFlow
        from m2flow.workflows.embodied.settings import run_settings, worker_settings

        if run.prepared is not None:  # the warm start: every policy copy starts from the cloned weights
            cfg = replace(cfg, policy=replace(cfg.policy, init_from=str(run.prepared)))
        return EmbodiedFlow(self, plan, executor, run, settings=run_settings(cfg, plan),
                            workers=partial(worker_settings, cfg, plan))

    def iterations(self, cfg: EmbodiedConfig, plan: Plan) -> int:
        return cfg.iterations(plan["env"].world_size)

    def profile_probes(self, cfg: EmbodiedConfig) -> list[dict[str, Any]]:
        return planning.profile_probes(cfg)

    def profile_length(self, cfg: EmbodiedConfig, iterations: int) -> dict[str, Any]:
        return planning.profile_length(cfg, iterations)

    def edge_bytes(self, cfg: EmbodiedConfig) -> dict[str, float]:
        return planning.edge_bytes(cfg)

    def model_bytes(self, checkpoint: Path | None) -> tuple[float, float]:
        return planning.model_bytes(checkpoint)

    def resumable(self, old: Plan, new: Plan) -> bool:
        return planning.resumable(old, new)

    def evaluate_checkpoint(self, checkpoint: Path, options: EvalOptions) -> CheckpointEval:
        """Mean raw return of whole episodes with deterministic actions (``evaluation.py``)."""
        from m2flow.commands import CommandError
        from m2flow.workflows.embodied import evaluation

        episodes = evaluation.DEFAULT_EPISODES if options.episodes is None else options.episodes
        results = evaluation.evaluate_checkpoint(checkpoint, episodes=episodes, overrides=options.overrides)
        if not results.get("eval/episodes"):
            raise CommandError(f"no episode of {checkpoint} finished")
        return CheckpointEval(results, evaluation.summary(checkpoint, results))


WORKFLOW = register_workflow(EmbodiedWorkflow())
