"""The reasoning workflow's plan function: how a config runs (its Plan), and what the planner needs to know.

Decisions made here and nowhere else: the devices of every rank, whether inference runs at all,
whether reward scores inside the rollout processes and the rollout generates inside the actor
processes, what each edge becomes, who takes turns on shared devices and offloads, how finely
data streams (continuous or chunked generation, the consumers' micro-batch sizes: ``granularity``),
and how many iterations the rollout may generate ahead of the actor (``max_staleness``) and whether
that overlaps anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from m2flow.config.schema import get_key
from m2flow.driver.workflow import Tunable
from m2flow.planner import ComponentPlan, EdgePlan, Plan
from m2flow.planner.graph import DRIVER
from m2flow.planner.setup import Workload
from m2flow.runtime.placement import NodeLayout, executor_kind, parse_placement
from m2flow.workers.config import batching_mode
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.graph import COMPONENTS, GRAPH

# An item is one response; chunks of prompts_per_chunk prompts stream down the chain (continuous
# generation: the prompts decoded at once, see ``granularity``).
WORKLOAD = Workload(
    chain=("rollout", "reward", "inference", "actor"),
    items=("prompts_per_step", "group_size"),
    micro_items=("prompts_per_chunk", "group_size"),
    inputs={"reward": ("responses",), "inference": ("scored",), "actor": ("ready", "scored")},
    weights=(("actor", "rollout"), ("actor", "inference")),
    categories={"rollout": "generate", "reward": "reward", "inference": "logprobs", "actor": "train"},
)



def chunk_sizes(cfg: ReasoningConfig) -> tuple[int, ...]:
    """Prompts per generation chunk worth trying: 1, 2, 4, 8, 16 and all of a step's, those that divide it."""
    prompts = cfg.data.prompts_per_step
    return tuple(sorted({c for c in (1, 2, 4, 8, 16, prompts) if c <= prompts and prompts % c == 0}))


# The plan settings the search varies, and the config key of each (chunked generation, when set).
TUNABLES = (Tunable("prompts_per_chunk", "rollout.prompts_per_chunk", chunk_sizes),)

def plan_reasoning(cfg: ReasoningConfig, layout: NodeLayout) -> Plan:
    """The plan of ``cfg`` on a cluster of ``layout``; a placement that cannot be met raises PlacementError."""
    from m2flow.backends.generation import generation_backend_class
    from m2flow.backends.training.factory import strategy_class

    placed = parse_placement(cfg.placement, layout, COMPONENTS)
    algo = cfg.algorithm
    notes = []
    infers = algo.old_logprobs == "inference" or algo.needs_reference
    if not infers:
        notes.append("inference does not run: no old-policy log-probs to compute (old_logprobs: "
                     f"{algo.old_logprobs}) and no reference model")
    reward_fused = cfg.reward.fuse_with_rollout and placed["reward"].same_devices(placed["rollout"])
    if cfg.reward.fuse_with_rollout and not reward_fused:
        notes.append("reward runs as its own group: it is not on the rollout's devices rank for rank")
    wants = cfg.rollout.fuse_with_actor
    same = placed["rollout"].same_devices(placed["actor"])
    staleness = algo.max_staleness
    fusable = (wants and same and not strategy_class(cfg.actor.strategy).sharded
               and generation_backend_class(cfg.rollout.backend).in_process
               and cfg.rollout.dtype == cfg.actor.dtype)
    # An actor process runs one call at a time: a rollout inside it could never generate ahead of training.
    rollout_fused = fusable and staleness == 0
    if wants and same and not fusable:
        notes.append("rollout runs as its own group: fusing into the actor needs a replicated actor.strategy (ddp), an in-process "
                     "backend and the actor's dtype")
    elif fusable and not rollout_fused:
        notes.append(f"rollout runs as its own group: with max_staleness {staleness} it generates ahead of the "
                     "actor, which it cannot do inside the actor's processes")
    rollout_host = "actor" if rollout_fused else "rollout"
    reward_host = rollout_host if reward_fused else "reward"
    hosts = {"rollout": rollout_host, "reward": reward_host, "inference": "inference", "actor": "actor"}
    # Model holders on shared devices take turns and give their memory back after their last turn.
    holders = [c for c in ("rollout", "inference", "actor") if (c != "inference" or infers) and hosts[c] == c]

    def shares(c: str) -> bool:
        return any(placed[c].devices & placed[o].devices for o in holders if o != c)

    threads = {c: int(get_key(cfg, key)) for c, key in GRAPH.thread_keys().items()}
    components = tuple(
        ComponentPlan(c, placed[c], hosts[c], active=(c != "inference" or infers),
                      shares_devices=c in holders and shares(c), offload=c in holders and shares(c),
                      threads=threads[c])
        for c in COMPONENTS)
    ranks = {c: placed[c].world_size for c in COMPONENTS}

    def edge(name: str, source: str, target: str, transport: str | None = None) -> EdgePlan:
        src, dst = (DRIVER if source == DRIVER else hosts[source]), hosts[target]
        kind = transport or ("in-process" if src == dst else "channel")
        return EdgePlan(name, src, dst, kind, ranks[dst] if dst != DRIVER else 1)

    scored_target = "inference" if infers else "actor"
    edges = (
        edge("prompts", DRIVER, "rollout"),
        edge("responses", "rollout", "reward", "in-process" if reward_fused else "channel"),
        edge("scored", "reward", scored_target),
        edge("ready", "inference", "actor") if infers else EdgePlan("ready", "inference", "actor", "unused", 0),
        EdgePlan("weights", "actor", "rollout", "unused", 0) if rollout_fused
        else EdgePlan("weights", "actor", "rollout", "p2p", ranks["rollout"]),
        EdgePlan("policy_weights", "actor", "inference", "p2p", ranks["inference"]) if infers
        else EdgePlan("policy_weights", "actor", "inference", "unused", 0),
    )
    settings = {"prompts_per_step": cfg.data.prompts_per_step, "group_size": cfg.rollout.sampling.n,
                **granularity(cfg, infers)}
    if settings["generation"] == "continuous":
        # Groups leave one by one only where the next stage can take them during generation: not when it
        # is the generating process itself (the fused actor), nor when it waits for the rollout's devices.
        nxt = "reward" if not reward_fused else scored_target
        waits = hosts[nxt] == rollout_host or (nxt in holders and placed[nxt].devices <= placed["rollout"].devices)
        settings["emit"] = "end of turn" if waits else "each group"
    # iterations the rollout may generate ahead of the actor (0: synchronous)
    settings["max_staleness"] = staleness
    if staleness:
        notes.append(_overlap_note(staleness, placed, holders))
    plan = Plan("reasoning", executor_kind(cfg.placement), cfg.placement, components, edges, settings, tuple(notes))
    return plan.validate(GRAPH)


def granularity(cfg: ReasoningConfig, infers: bool) -> dict[str, int | str]:
    """How finely data streams: the generation mode and the micro-batch sizes of the consumers.

    ``continuous``: each group goes downstream the moment its last response ends, at most
    ``max_running`` responses decoding at once; ``prompts_per_chunk`` is then what the simulator costs
    as one generation call (the prompts decoded together). ``chunked``: a chunk's groups go downstream
    when it ends. Consumers take micro-batches of what is ready, by responses or, when set, by tokens.
    """
    rollout, prompts = cfg.rollout, cfg.data.prompts_per_step
    mode = batching_mode(rollout)
    out: dict[str, int | str] = {"generation": mode}
    if mode == "continuous":
        out["max_running"] = rollout.max_running
        out["prompts_per_chunk"] = max(1, min(prompts, rollout.max_running // rollout.sampling.n))
    else:
        out["prompts_per_chunk"] = rollout.prompts_per_chunk or prompts
    for name, section in (("actor", cfg.actor), ("inference", cfg.inference if infers else None)):
        if section is None:
            continue
        if section.micro_batch_tokens is not None:
            out[f"{name}_micro_batch_tokens"] = section.micro_batch_tokens
        else:
            out[f"{name}_micro_batch"] = section.micro_batch_size
    return out


def _overlap_note(staleness: int, placed: dict, holders: list[str]) -> str:
    """What generating ahead overlaps on this placement, in one line."""
    ahead = (f"max_staleness {staleness}: iteration{'s' if staleness > 1 else ''} k+1"
             f"{f'..k+{staleness}' if staleness > 1 else ''} generate{'' if staleness > 1 else 's'} while the actor trains on k")
    shared = [c for c in holders if c != "actor" and placed[c].devices & placed["actor"].devices]
    if not shared:
        return ahead + " (on devices of their own: generation and training overlap)"
    return (ahead + f", but {' and '.join(shared)} share devices with the actor: they take turns under the device "
            "lock, so their compute does not overlap (only waits, scoring and transfers do)")


# ----------------------------------------------------------------------------- profiling and placement: auto

def profile_probes(cfg: ReasoningConfig) -> list[dict[str, Any]]:
    """Batch sizes to profile: a quarter, half and all of ``prompts_per_step``, each generated as one chunk."""
    p = cfg.data.prompts_per_step
    return [{"data.prompts_per_step": s, "rollout.prompts_per_chunk": None}
            for s in sorted({max(1, p // 4), max(1, p // 2), p})]


def profile_length(cfg: ReasoningConfig, iterations: int) -> dict[str, Any]:
    """``iterations`` iterations, no warm start and no held-out evaluation (a profile prices the loop)."""
    return {"steps": iterations, "model.warm_start.steps": 0, "eval_every": 0}


def edge_bytes(cfg: ReasoningConfig) -> dict[str, float]:
    """Bytes per response on each data edge, from the sequence lengths: token ids and masks (8 bytes a
    token each) of prompt and response, and per response token a log-prob or two (4 bytes each)."""
    prompt = cfg.data.max_prompt_tokens or cfg.model.tiny.max_position_embeddings // 2
    response = cfg.rollout.sampling.max_new_tokens
    tokens = 16 * (prompt + response)
    return {"responses": tokens, "scored": tokens + 4.0, "ready": tokens + 8.0 * response}


def model_bytes(checkpoint: Path | None) -> tuple[float, float]:
    """(the policy's weight files, the whole checkpoint: weights, optimizer and schedule state)."""
    if checkpoint is None:
        return 0.0, 0.0
    from m2flow.workers.actor import ACTOR_DIR

    weights = sum(f.stat().st_size for f in (checkpoint / ACTOR_DIR).glob("*.safetensors"))
    total = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    return float(weights), float(total)

