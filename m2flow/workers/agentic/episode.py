"""Multi-turn rollout: model turn, environment or tool observation, model turn ... for a batch of episodes.

``run_episodes`` plays one episode in each environment of a ``TextEnvBatch`` with a generation backend,
through the one turn loop (``turn_loop.play_turns``): each round generates one turn for every episode
still running (one ``generate`` call over their whole contexts, so the backend needs no state between
turns), hands each turn's text to its environment, and appends the observation's tokens. An episode ends
when its environment ends it, fails, or when the rollout's turn budget (``max_turns`` model turns) or
token budget (``max_tokens`` response tokens, model and observation together) is spent. The engine knows
nothing about Ray, rewards or training. The model's half of each round (budgets, contexts, observations)
is ``TurnEngine`` (``turns.py``), which the agentic workflow's rollout workers use in the same loop with
environments held by other processes; here the environments are at hand (evaluation, the episode tests).

Token ids are never re-tokenized: a context is the prompt's ids followed by the ids the model generated
and the observations' ids, so the generator's log-probs belong to exactly the tokens trained on.

Deviations from a chat-serving loop, on purpose: a turn is cut at the tool-call stop string (nothing
after a call is generated), and rounds are synchronous across the batch (the workflow above streams
finished trajectories on; continuous batching across turns is the backend's business).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from m2flow.backends.generation.base import GenerationBackend
from m2flow.envs.text.batch import EnvStep, TextEnvBatch
from m2flow.workers.agentic.env_worker import EnvSettings, EnvsInProcess, TextEnvs
from m2flow.workers.agentic.trajectory import Trajectory
from m2flow.workers.agentic.turn_loop import play_turns
from m2flow.workers.agentic.turns import EpisodeConfig, EpisodeSpec, EpisodeStats, TurnEngine

__all__ = ["EpisodeConfig", "EpisodeStats", "held_out_metrics", "run_episodes", "turn_seed"]

logger = logging.getLogger(__name__)


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of one round of turns: distinct per (seed, turn), reproducible."""
    return int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


class _EnginePolicy:
    """A ``TurnEngine`` with its backend at hand as the turn loop's policy side; round r sampled from
    ``turn_seed(seed, r)``."""

    def __init__(self, engine: TurnEngine, backend: GenerationBackend, seed: int) -> None:
        self.engine, self.backend, self.seed = engine, backend, seed

    def start_episodes(self, first: Mapping[int, EnvStep]) -> list[int]:
        return self.engine.begin(first)

    def play_turn(self, round_: int) -> tuple[dict[int, str], list[int]]:
        return self.engine.turn(self.backend, turn_seed(self.seed, round_))

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        return self.engine.observe(results)

    def rerun(self, traj_ids: Sequence[int]) -> None:
        self.engine.rerun(traj_ids)


def run_episodes(backend: GenerationBackend, tokenizer: Any, envs: TextEnvBatch, seeds: Sequence[int],
                 group_ids: Sequence[int], cfg: EpisodeConfig,
                 first_traj_id: int = 0) -> tuple[list[Trajectory], EpisodeStats]:
    """One episode per environment (env i reset with ``seeds[i]``, in GRPO group ``group_ids[i]``); the
    trajectories in environment order (ids ``first_traj_id + i``) and the batch's statistics."""
    if not len(seeds) == len(group_ids) == len(envs):
        raise ValueError(f"{len(seeds)} seeds and {len(group_ids)} group ids for {len(envs)} environments")
    specs = [EpisodeSpec(first_traj_id + i, int(g), int(s), i) for i, (s, g) in enumerate(zip(seeds, group_ids))]
    engine = TurnEngine(cfg, tokenizer, specs)
    # Episode i in environment i: the ids are reset in order, so ``TextEnvs`` gives episode i slot i.
    held = EnvsInProcess(TextEnvs(envs), {s.traj_id: s.seed for s in specs})
    play_turns(_EnginePolicy(engine, backend, cfg.seed), held, [s.traj_id for s in specs])
    stats = engine.close()
    stats.env += envs.pop_stats()
    return [engine.trajectory(s.traj_id) for s in specs], stats


def held_out_metrics(backend: GenerationBackend, tokenizer: Any, env: EnvSettings, seeds: Sequence[int],
                     cfg: EpisodeConfig) -> dict[str, float]:
    """One episode per seed on fresh environments of ``env`` (episode i in group i): mean return, success rate,
    turns and tool calls per episode (``eval/...``). The held-out evaluation of a run (on its rollout rank 0)
    and of a saved checkpoint (``m2flow eval``) alike; every environment failure is tolerated (counted in the
    episode's end)."""
    from dataclasses import replace

    envs = replace(env, num_envs=len(seeds)).batch(max_error_rate=1.0)
    trajs, stats = run_episodes(backend, tokenizer, envs, list(seeds), list(range(len(seeds))), cfg)
    n = max(1, len(trajs))
    return {"eval/return_mean": sum(t.reward for t in trajs) / n,
            "eval/success": sum(t.finish_reason == "terminated" and t.reward > 0 for t in trajs) / n,
            "eval/turns_mean": stats.turns / n,
            "eval/tool_calls": float(sum(stats.tool_outcomes.values())) / n}
