"""The embodied workflow's graph: every component declared once, with its worker, config section,
threads key, timing metric and fusion. The plan builder, the flow's groups, the profiler's probes
and the plan search read it from here."""

from __future__ import annotations

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph

GRAPH = WorkflowGraph(
    name="embodied",
    components=(
        Component("env", "steps vectorised simulators, K pipeline stages per rank",
                  worker="m2flow.workers.embodied.env:EnvWorker", section="env_worker", timing="time/env_busy_s"),
        Component("rollout", "the policy's actions for each stage's observations", holds_model=True,
                  worker="m2flow.workers.embodied.rollout:RolloutWorker", section="rollout",
                  timing="time/rollout_busy_s"),
        Component("actor", "GAE and PPO updates on the trajectories", holds_model=True, trains=True,
                  worker="m2flow.workers.embodied.actor:ActorWorker", section="actor", timing="time/actor_busy_s"),
    ),
    edges=(
        Edge("observations", "env", "rollout", "observations of one stage", kind="p2p"),
        Edge("actions", "rollout", "env", "actions (and values, log-probs) of one stage", kind="p2p"),
        Edge("trajectories", "env", "actor", "Trajectory", kind="p2p"),
        Edge("weights", "actor", "rollout", "state dict", kind="weights"),
    ),
    fusions=(
        Fusion("rollout", "env", "on the env's devices rank for rank", key="rollout.fuse_with_env"),
    ),
)

COMPONENTS = GRAPH.component_names
