"""The reasoning workflow's graph: every component declared once, with its worker, config section,
threads key, timing metric and fusions. The plan builder, the flow's groups, the profiler's probes
and the plan search read it from here."""

from __future__ import annotations

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph
from m2flow.planner.graph import DRIVER

GRAPH = WorkflowGraph(
    name="reasoning",
    components=(
        Component("rollout", "samples a group of responses for every prompt", holds_model=True,
                  worker="m2flow.workers.rollout:RolloutWorker", section="rollout", timing="time/generate"),
        Component("reward", "scores each response against the prompt's reference answer",
                  worker="m2flow.workers.reward:RewardWorker", section="reward", timing="time/reward"),
        Component("inference", "old-policy and reference log-probs of each response", holds_model=True,
                  optional=True, worker="m2flow.workers.inference:InferenceWorker", section="inference",
                  timing="time/inference"),
        Component("actor", "advantages per group, then policy-gradient updates", holds_model=True, trains=True,
                  worker="m2flow.workers.actor:ActorWorker", section="actor", timing="time/train_busy"),
    ),
    edges=(
        Edge("prompts", DRIVER, "rollout", "PromptTask"),
        Edge("responses", "rollout", "reward", "GroupSample"),
        Edge("scored", "reward", "inference", "GroupSample"),
        Edge("ready", "inference", "actor", "GroupSample"),
        Edge("weights", "actor", "rollout", "state dict", kind="weights"),
        Edge("policy_weights", "actor", "inference", "state dict", kind="weights"),
    ),
    fusions=(
        Fusion("reward", "rollout", "on the rollout's devices rank for rank", key="reward.fuse_with_rollout"),
        Fusion("rollout", "actor", "on the actor's devices rank for rank, actor.strategy ddp, an in-process "
                                   "generation backend, the same dtype, max_staleness 0",
               key="rollout.fuse_with_actor"),
    ),
)

COMPONENTS = GRAPH.component_names
