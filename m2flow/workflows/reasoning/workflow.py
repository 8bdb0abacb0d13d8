"""The reasoning RL workflow (``workflow: reasoning``): its declaration, registered by name.

GRPO, PPO, DAPO, REINFORCE++ and RLOO on a causal language model with verifiable rewards. The graph
(``graph.py``) declares the components, the plan function (``plan.py``) decides how a config runs,
the flow (``flow.py``) is the live system one iteration at a time; the driver runs the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from m2flow.driver.registry import register_workflow
from m2flow.driver.workflow import Launch, Workflow
from m2flow.planner import Plan
from m2flow.runtime.executors import Executor
from m2flow.runtime.placement import NodeLayout
from m2flow.workflows.reasoning import plan as planning
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.flow import Prepared, ReasoningFlow
from m2flow.workflows.reasoning.graph import GRAPH


class ReasoningWorkflow(Workflow):
    name = "reasoning"
    schema = ReasoningConfig
    graph = GRAPH
    help = "Reasoning RL on a causal language model: GRPO, PPO, DAPO, REINFORCE++, RLOO"
    tunables = planning.TUNABLES

    def plan(self, cfg: ReasoningConfig, layout: NodeLayout) -> Plan:
        return planning.plan_reasoning(cfg, layout)

    def workload(self) -> Any:
        return planning.WORKLOAD

    def prepare(self, cfg: ReasoningConfig, run_dir: Path) -> Prepared:
        """The model (built, then warm-started once, before any worker loads it) and the data sets."""
        from m2flow.models.tokenizer import load_tokenizer
        from m2flow.workflows.reasoning.data import load_datasets, prepare_model
        from m2flow.workflows.reasoning.warm_start import warm_start_model

        model_path = prepare_model(cfg.model, cfg.data)
        if cfg.model.warm_start.steps:
            model_path = warm_start_model(cfg, model_path)
        train_set, test_set = load_datasets(cfg.data, load_tokenizer(model_path))
        return Prepared(model_path, train_set, test_set)

    def launch(self, cfg: ReasoningConfig, plan: Plan, executor: Executor, run: Launch) -> ReasoningFlow:
        return ReasoningFlow(self, cfg, plan, executor, run)

    def iterations(self, cfg: ReasoningConfig, plan: Plan) -> int:
        return cfg.steps

    def profile_probes(self, cfg: ReasoningConfig) -> list[dict[str, Any]]:
        return planning.profile_probes(cfg)

    def profile_length(self, cfg: ReasoningConfig, iterations: int) -> dict[str, Any]:
        return planning.profile_length(cfg, iterations)

    def edge_bytes(self, cfg: ReasoningConfig) -> dict[str, float]:
        return planning.edge_bytes(cfg)

    def model_bytes(self, checkpoint: Path | None) -> tuple[float, float]:
        return planning.model_bytes(checkpoint)


WORKFLOW = register_workflow(ReasoningWorkflow())
