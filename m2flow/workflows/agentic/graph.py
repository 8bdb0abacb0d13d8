"""The agentic workflow's graph: every component declared once, with its worker, config section, threads
key, timing metric and fusion. The plan builder, the flow's groups, the profiler's probes and the plan
search read it from here."""

from __future__ import annotations

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph

GRAPH = WorkflowGraph(
    name="agentic",
    components=(
        Component("env", "holds many text environments (and their tools) per rank; resets and steps them",
                  worker="m2flow.workers.agentic.env_worker:EnvWorker", section="env", timing="time/env_busy_s",
                  cpu_timing="time/env_cpu_s", rank_groups=True),
        Component("rollout", "model turns of every running episode; finished groups streamed to the actor",
                  holds_model=True, worker="m2flow.workers.agentic.rollout_worker:AgenticRolloutWorker",
                  section="rollout", timing="time/generate_busy_s"),
        Component("actor", "advantages per group, then policy-gradient updates on the model's tokens",
                  holds_model=True, worker="m2flow.workers.actor:ActorWorker", section="actor",
                  timing="time/train_busy"),
    ),
    edges=(
        Edge("actions", "rollout", "env", "the text of each model turn", kind="p2p"),
        Edge("observations", "env", "rollout", "EnvStep", kind="p2p"),
        Edge("trajectories", "rollout", "actor", "GroupSample"),
        Edge("weights", "actor", "rollout", "state dict", kind="weights"),
    ),
    fusions=(
        Fusion("env", "rollout", "on the rollout's devices rank for rank", key="env.fuse_with_rollout"),
    ),
)

COMPONENTS = GRAPH.component_names
