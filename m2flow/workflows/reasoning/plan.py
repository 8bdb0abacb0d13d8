"""The reasoning workflow's plan constraints: what its config adds to the one plan builder, and what the planner needs to know.

The one builder (``planner.build``) decides devices, fusions, edges and turns from the graph; this
workflow adds its constraints: whether inference runs at all (``inactive``), when the rollout cannot
generate inside the actor's processes (``fusion_refusal``), how finely data streams (continuous or
chunked generation, the consumers' micro-batch sizes: ``granularity``), how many iterations the
rollout may generate ahead of the actor (``max_staleness``) and whether that overlaps anything
(``notes``), and what a placement must give the config (``check``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collections.abc import Mapping

from m2flow.driver.workflow import Tunable
from m2flow.planner import Plan
from m2flow.planner.partial import partial_notes
from m2flow.planner.partial import run_ahead as partial_run_ahead
from m2flow.planner.setup import Workload
from m2flow.workers.config import batching_mode
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.graph import GRAPH

# An item is one response; chunks of prompts_per_chunk prompts stream down the chain (continuous
# generation: the prompts decoded at once, see ``granularity``).
WORKLOAD = Workload(
    chain=("rollout", "reward", "inference", "actor"),
    items=("prompts_per_step", "group_size"),
    micro_items=("prompts_per_chunk", "group_size"),
    inputs={"reward": ("responses",), "inference": ("scored",), "actor": ("ready", "scored")},
    weights=(("actor", "rollout"), ("actor", "inference")),
    categories={"rollout": "generate", "reward": "reward", "inference": "logprobs", "actor": "train"},
    run_ahead="run_ahead",
)



def chunk_sizes(cfg: ReasoningConfig) -> tuple[int, ...]:
    """Prompts per generation chunk worth trying: 1, 2, 4, 8, 16 and all of a step's, those that divide it."""
    prompts = cfg.data.prompts_per_step
    return tuple(sorted({c for c in (1, 2, 4, 8, 16, prompts) if c <= prompts and prompts % c == 0}))


# The plan settings the search varies, and the config key of each (chunked generation, when set).
TUNABLES = (Tunable("prompts_per_chunk", "rollout.prompts_per_chunk", chunk_sizes),)

def inactive(cfg: ReasoningConfig) -> dict[str, str]:
    """Inference runs only for old-policy log-probs or a reference model."""
    algo = cfg.algorithm
    if algo.old_logprobs == "inference" or algo.needs_reference:
        return {}
    return {"inference": "inference does not run: no old-policy log-probs to compute (old_logprobs: "
                         f"{algo.old_logprobs}) and no reference model"}


def fusion_refusal(cfg: ReasoningConfig, component: str, host: str) -> str:
    """Why the rollout cannot generate inside the actor's processes under ``cfg`` ("" when it can)."""
    if (component, host) != ("rollout", "actor"):
        return ""
    from m2flow.backends.generation.registry import generation_backend_traits
    from m2flow.backends.training.registry import strategy_traits

    if (strategy_traits(cfg.actor.strategy).sharded or not generation_backend_traits(cfg.rollout.backend).in_process
            or cfg.rollout.dtype != cfg.actor.dtype):
        return ("rollout runs as its own group: fusing into the actor needs a replicated actor.strategy (ddp), an "
                "in-process backend and the actor's dtype")
    if cfg.algorithm.max_staleness:
        # An actor process runs one call at a time: a rollout inside it could never generate ahead of training.
        return (f"rollout runs as its own group: with max_staleness {cfg.algorithm.max_staleness} it generates "
                "ahead of the actor, which it cannot do inside the actor's processes")
    return ""


def settings(cfg: ReasoningConfig, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's settings: batch shape, ``granularity`` (with the search's ``prompts_per_chunk`` in place of
    the config's), when groups leave a continuous generation, ``max_staleness``."""
    out: dict[str, Any] = {"prompts_per_step": cfg.data.prompts_per_step, "group_size": cfg.rollout.sampling.n,
                           **granularity(cfg, plan.runs("inference"),
                                         values.get("prompts_per_chunk", cfg.rollout.prompts_per_chunk))}
    if out["generation"] == "continuous":
        # Groups leave one by one only where the next stage can take them during generation: not when it
        # is the generating process itself (the fused actor), nor when it waits for the rollout's devices.
        nxt = plan.edge("responses").target if not plan.fused("reward") else plan.edge("scored").target
        rollout = plan["rollout"]
        waits = nxt == rollout.host or (nxt in _model_groups(plan) and plan[nxt].placement.devices <= rollout.placement.devices)
        out["emit"] = "end of turn" if waits else "each group"
    # the bound on a trained group's age, and the iterations the rollout generates ahead of the actor
    out["max_staleness"] = cfg.algorithm.max_staleness
    out["run_ahead"] = run_ahead(cfg)
    return out


def run_ahead(cfg: ReasoningConfig) -> int:
    """Iterations the rollout generates ahead of the actor (0: synchronous): ``max_staleness`` s, or s - 1
    with partial rollouts, whose carried tokens are trained an iteration after they were sampled
    (``planner.partial.run_ahead``).

    The other half of what the planner knows of partial rollouts is in the profile: its probes run this
    config, partial rollouts included, so the rollout's curve is fitted on iterations that stop at the groups
    that finish first, as measured on this machine (``planner/partial.py`` says why no length model)."""
    return partial_run_ahead(cfg.algorithm.max_staleness, cfg.rollout.partial)


def notes(cfg: ReasoningConfig, plan: Plan) -> tuple[str, ...]:
    """With staleness, what generating ahead overlaps on this plan; with partial rollouts, that the rollout runs
    one iteration less ahead (a carried response's tokens are trained an iteration after they were sampled) and
    how their generation is priced."""
    staleness, ahead = cfg.algorithm.max_staleness, run_ahead(cfg)
    if not staleness:
        return ()
    partial = partial_notes(cfg.rollout.partial, staleness)
    return (*partial, _overlap_note(ahead, plan)) if ahead else partial


def _model_groups(plan: Plan) -> list[str]:
    """The launched groups that hold a model of their own (they take turns on shared devices)."""
    return [c.name for c in plan.components if c.launched and GRAPH.component(c.name).holds_model]


def granularity(cfg: ReasoningConfig, infers: bool, chunk: int | None) -> dict[str, int | str]:
    """How finely data streams: the generation mode and the micro-batch sizes of the consumers.

    ``continuous``: each group goes downstream the moment its last response ends, at most
    ``max_running`` responses decoding at once; ``prompts_per_chunk`` is then what the simulator costs
    as one generation call (the prompts decoded together). ``chunked``: chunks of ``chunk`` prompts
    (None: all of a step's), a chunk's groups going downstream when it ends. Consumers take micro-batches
    of what is ready, by responses or, when set, by tokens. A chunk under ``batching: continuous`` is
    refused (ValueError), as the config refuses one.
    """
    rollout, prompts = cfg.rollout, cfg.data.prompts_per_step
    mode = batching_mode(rollout, chunk)
    if mode == "continuous" and chunk is not None:
        raise ValueError("prompts_per_chunk applies to batching 'chunked', not 'continuous'")
    out: dict[str, int | str] = {"generation": mode}
    if mode == "continuous":
        out["max_running"] = rollout.max_running
        out["prompts_per_chunk"] = max(1, min(prompts, rollout.max_running // rollout.sampling.n))
    else:
        out["prompts_per_chunk"] = chunk or prompts
    for name, section in (("actor", cfg.actor), ("inference", cfg.inference if infers else None)):
        if section is None:
            continue
        if section.micro_batch_tokens is not None:
            out[f"{name}_micro_batch_tokens"] = section.micro_batch_tokens
        else:
            out[f"{name}_micro_batch"] = section.micro_batch_size
    return out


def _overlap_note(staleness: int, plan: Plan) -> str:
    """What generating ahead overlaps on this plan, in one line."""
    ahead = (f"max_staleness {staleness}: iteration{'s' if staleness > 1 else ''} k+1"
             f"{f'..k+{staleness}' if staleness > 1 else ''} generate{'' if staleness > 1 else 's'} while the actor trains on k")
    actor = plan["actor"].placement.devices
    shared = [c for c in _model_groups(plan) if c != "actor" and plan[c].placement.devices & actor]
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
    from m2flow.workers.actor_files import ACTOR_DIR

    weights = sum(f.stat().st_size for f in (checkpoint / ACTOR_DIR).glob("*.safetensors"))
    total = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    return float(weights), float(total)

