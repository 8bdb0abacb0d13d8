"""The embodied workflow's graph, and the one function that decides how a config runs (its Plan).

Decisions made here and nowhere else: the devices of every rank, whether the policy runs inside
the env processes (rollout fused into env), what each edge becomes, who takes turns on shared
devices and offloads, the pipeline stages of every env rank, and how many iterations the env ranks
may collect ahead of the actor (``max_staleness``).
"""

from __future__ import annotations

from m2flow.planner import Component, ComponentPlan, Edge, EdgePlan, Fusion, Plan, WorkflowGraph
from m2flow.planner.search import SearchSpace
from m2flow.planner.setup import Workload
from m2flow.runtime.placement import NodeLayout, executor_kind, parse_placement
from m2flow.workflows.embodied_config import COMPONENTS, EmbodiedConfig

GRAPH = WorkflowGraph(
    name="embodied",
    components=(
        Component("env", "steps vectorised simulators, K pipeline stages per rank"),
        Component("rollout", "the policy's actions for each stage's observations", holds_model=True),
        Component("actor", "GAE and PPO updates on the trajectories", holds_model=True),
    ),
    edges=(
        Edge("observations", "env", "rollout", "observations of one stage", kind="p2p"),
        Edge("actions", "rollout", "env", "actions (and values, log-probs) of one stage", kind="p2p"),
        Edge("trajectories", "env", "actor", "Trajectory", kind="p2p"),
        Edge("weights", "actor", "rollout", "state dict", kind="weights"),
    ),
    fusions=(
        Fusion("rollout", "env", "rollout.fuse_with_env, on the env's devices rank for rank"),
    ),
)
assert GRAPH.component_names == COMPONENTS

# An item is one env step of one env; every env rank steps envs_per_rank envs, in pipeline stages.
WORKLOAD = Workload(
    chain=("actor",),
    items=("envs_per_rank", "rollout_steps"),
    items_per_rank_of="env",
    loop=("env", "rollout"),
    loop_steps="rollout_steps",
    loop_items=("envs_per_rank",),
    stages="pipeline_stages",
    inputs={"rollout": ("observations",), "env": ("actions",), "actor": ("trajectories",)},
    weights=(("actor", "rollout"),),
    categories={"env": "env_step", "rollout": "rollout", "actor": "train"},
)


def plan_embodied(cfg: EmbodiedConfig, layout: NodeLayout) -> Plan:
    """The plan of ``cfg`` on a cluster of ``layout``; a placement that cannot be met raises PlacementError."""
    placed = parse_placement(cfg.placement, layout, COMPONENTS)
    fused = cfg.rollout.fuse_with_env and placed["env"].same_devices(placed["rollout"])
    notes = []
    if cfg.rollout.fuse_with_env and not fused:
        notes.append("the policy runs in rollout ranks of its own: they are not on the env's devices rank for rank")
    holder = "env" if fused else "rollout"  # the process that holds the policy copy
    shares = bool(placed[holder].devices & placed["actor"].devices)
    ranks = {c: placed[c].world_size for c in COMPONENTS}
    components = (
        ComponentPlan("env", placed["env"], "env", shares_devices=fused and shares,
                      offload=fused and shares and cfg.rollout.offload, threads=cfg.env_worker.num_threads),
        ComponentPlan("rollout", placed["rollout"], holder, shares_devices=not fused and shares,
                      offload=not fused and shares and cfg.rollout.offload, threads=cfg.rollout.num_threads),
        ComponentPlan("actor", placed["actor"], "actor", shares_devices=shares, offload=shares and cfg.actor.offload,
                      threads=cfg.actor.num_threads),
    )
    if fused:
        edges = (EdgePlan("observations", "env", "env", "in-process", ranks["env"]),
                 EdgePlan("actions", "env", "env", "in-process", ranks["env"]))
    else:
        edges = (EdgePlan("observations", "env", "rollout", "p2p", ranks["rollout"]),
                 EdgePlan("actions", "rollout", "env", "p2p", ranks["env"]))
    edges += (EdgePlan("trajectories", "env", "actor", "p2p", ranks["actor"]),
              EdgePlan("weights", "actor", holder, "p2p", ranks[holder]))
    settings = {"pipeline_stages": cfg.pipeline_stages, "rollout_steps": cfg.rollout_steps,
                "envs_per_rank": cfg.env.num_envs, "minibatch_size": cfg.algorithm.minibatch_size,
                # iterations the env ranks may collect ahead of the actor (0: synchronous)
                "max_staleness": cfg.algorithm.max_staleness}
    plan = Plan("embodied", executor_kind(cfg.placement), cfg.placement, components, edges, settings, tuple(notes))
    return plan.validate(GRAPH)


def search_space(cfg: EmbodiedConfig, plan: Plan) -> SearchSpace:
    """What ``m2flow plan search`` varies for ``cfg``: placement, the policy in env, pipeline stages."""
    envs = cfg.env.num_envs
    stages = sorted({k for k in (1, 2, 4, cfg.pipeline_stages) if k <= envs and envs % k == 0})
    return SearchSpace(
        GRAPH, WORKLOAD, tuple(c.name for c in plan.components if c.active), dict(plan.settings),
        knobs={"pipeline_stages": tuple(stages)}, knob_settings={"pipeline_stages": "pipeline_stages"},
        fusion_keys={("rollout", "env"): "rollout.fuse_with_env"},
        threads={c.name: c.threads for c in plan.components})
