"""The reasoning RL workflow (``workflow: reasoning``): its declaration, registered by name.

GRPO, PPO, DAPO, REINFORCE++ and RLOO on a causal language model with verifiable rewards. The graph
(``graph.py``) declares the components, ``plan.py`` holds the constraints its config adds to the one plan builder,
the flow (``flow.py``) is the live system one iteration at a time; the driver runs the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m2flow.driver.registry import register_workflow
from m2flow.driver.workflow import CheckpointEval, EvalOptions, Launch, Workflow
from m2flow.planner import Plan
from m2flow.runtime.executors import Executor
from m2flow.workflows.reasoning import plan as planning
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.graph import GRAPH

if TYPE_CHECKING:  # the flow (workers, models, torch) is imported when a run launches, not to plan one
    from m2flow.workflows.reasoning.flow import Prepared, ReasoningFlow


class ReasoningWorkflow(Workflow):
    name = "reasoning"
    schema = ReasoningConfig
    graph = GRAPH
    help = "Reasoning RL on a causal language model: GRPO, PPO, DAPO, REINFORCE++, RLOO"
    tunables = planning.TUNABLES

    def inactive(self, cfg: ReasoningConfig) -> dict[str, str]:
        return planning.inactive(cfg)

    def fusion_refusal(self, cfg: ReasoningConfig, component: str, host: str) -> str:
        return planning.fusion_refusal(cfg, component, host)

    def settings(self, cfg: ReasoningConfig, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
        return planning.settings(cfg, plan, values)

    def notes(self, cfg: ReasoningConfig, plan: Plan) -> tuple[str, ...]:
        return planning.notes(cfg, plan)

    def check(self, cfg: ReasoningConfig, plan: Plan) -> None:
        cfg.check_ranks({c.name: c.world_size for c in plan.components})

    def workload(self) -> Any:
        return planning.WORKLOAD

    def warm_start(self, cfg: ReasoningConfig) -> str | None:
        return "model.warm_start" if cfg.model.warm_start.steps else None

    def prepare(self, cfg: ReasoningConfig, run_dir: Path) -> Prepared:
        """The model (built, then warm-started once, before any worker loads it) and the data sets."""
        from m2flow.models.tokenizer import load_tokenizer
        from m2flow.workflows.reasoning.data import load_datasets, prepare_model
        from m2flow.workflows.reasoning.warm_start import warm_start_model

        model_path = prepare_model(cfg.model, cfg.data)
        if cfg.model.warm_start.steps:
            model_path = warm_start_model(cfg, model_path)
        train_set, test_set = load_datasets(cfg.data, load_tokenizer(model_path))
        from m2flow.workflows.reasoning.flow import Prepared

        return Prepared(model_path, train_set, test_set)

    def launch(self, cfg: ReasoningConfig, plan: Plan, executor: Executor, run: Launch) -> ReasoningFlow:
        from functools import partial

        from m2flow.workflows.reasoning.flow import ReasoningFlow
        from m2flow.workflows.reasoning.settings import run_settings, worker_settings

        return ReasoningFlow(self, plan, executor, run, settings=run_settings(cfg),
                             workers=partial(worker_settings, cfg, plan))

    def profile_probes(self, cfg: ReasoningConfig) -> list[dict[str, Any]]:
        return planning.profile_probes(cfg)

    def profile_length(self, cfg: ReasoningConfig, iterations: int) -> dict[str, Any]:
        return planning.profile_length(cfg, iterations)

    def edge_bytes(self, cfg: ReasoningConfig) -> dict[str, float]:
        return planning.edge_bytes(cfg)

    def model_bytes(self, checkpoint: Path | None) -> tuple[float, float]:
        return planning.model_bytes(checkpoint)

    takes_eval_config = True

    def evaluate_checkpoint(self, checkpoint: Path, options: EvalOptions) -> CheckpointEval:
        """Greedy accuracy and mean response length on a dataset (``evaluation.py``)."""
        from m2flow.workflows.reasoning.evaluation import evaluate_saved

        return evaluate_saved(checkpoint, options)


WORKFLOW = register_workflow(ReasoningWorkflow())
