"""Multi-turn rollout: model turn, environment or tool observation, model turn ... for a batch of episodes.

``run_episodes`` plays one episode in each environment of a ``TextEnvBatch`` with a generation backend:
each round generates one turn for every episode still running (one ``generate`` call over their whole
contexts, so the backend needs no state between turns), hands each turn's text to its environment, and
appends the observation's tokens. An episode ends when its environment ends it, fails, or when the
rollout's turn budget (``max_turns`` model turns) or token budget (``max_tokens`` response tokens, model
and observation together) is spent. The engine knows nothing about Ray, rewards or training.

Token ids are never re-tokenized: a context is the prompt's ids followed by the ids the model generated
and the observations' ids, so the generator's log-probs belong to exactly the tokens trained on.

Deviations from a chat-serving loop, on purpose: a turn is cut at the tool-call stop string (nothing
after a call is generated), and rounds are synchronous across the batch (the workflow above streams
finished trajectories on; continuous batching across turns is the backend's business).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from m2flow.backends.generation.base import GenerationBackend, SamplingParams
from m2flow.envs.text.batch import EnvStep, TextEnvBatch, TextEnvStats
from m2flow.rewards.tools.calls import CALL_STOP
from m2flow.workers.agentic.trajectory import FinishReason, Trajectory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeConfig:
    """How episodes are rolled out."""

    max_turns: int = 4
    """Most model turns per episode (the turn budget)."""
    max_tokens: int = 256
    """Most response tokens per episode, model and observation tokens together (the token budget)."""
    max_turn_tokens: int = 64
    """Most tokens one model turn may generate."""
    temperature: float = 1.0
    """Sampling temperature; 0 is greedy."""
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = (CALL_STOP,)
    """Strings that end a model turn (besides end-of-sequence); the tool-call closing tag by default."""
    prompt_template: str = "{observation}"
    """How the first observation becomes the prompt."""
    observation_template: str = "{observation}"
    """How a later observation is written into the context (an empty observation adds nothing)."""
    seed: int = 0
    """Seed of the sampling; the same seed, batch and environments give the same trajectories."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_turn_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prompt_template", "observation_template"):
            if "{observation}" not in getattr(self, name):
                raise ValueError(f"{name} must contain '{{observation}}'")


@dataclass
class EpisodeStats:
    """What a batch of episodes did; metric names under ``rollout/``, ``tool/`` and ``env/``."""

    trajectories: int = 0
    turns: int = 0
    model_tokens: int = 0
    observation_tokens: int = 0
    finish: Counter = field(default_factory=Counter)
    tool_outcomes: Counter = field(default_factory=Counter)
    env: TextEnvStats = field(default_factory=TextEnvStats)
    generate_s: float = 0.0
    env_s: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        n = max(1, self.trajectories)
        out = {"rollout/trajectories": float(self.trajectories), "rollout/turns_mean": self.turns / n,
               "rollout/model_tokens": float(self.model_tokens),
               "rollout/observation_tokens": float(self.observation_tokens),
               "time/generate_s": self.generate_s, "time/env_s": self.env_s}
        out.update({f"rollout/finish_{k}": float(v) for k, v in sorted(self.finish.items())})
        out.update({f"tool/{k}": float(v) for k, v in sorted(self.tool_outcomes.items())})
        out.update(self.env.as_metrics())
        return out


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of one round of turns: distinct per (seed, turn), reproducible."""
    return int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


class _Episode:
    """A trajectory being built, and its context."""

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.context = list(traj.prompt_ids)
        self.done = False

    def end(self, reason: FinishReason, error: str = "") -> None:
        self.traj.finish_reason, self.traj.error, self.done = reason, error, True

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.traj.response_ids.extend(ids)
        self.context.extend(ids)
        self.traj.action_mask.extend([1 if logprobs is not None else 0] * len(ids))
        self.traj.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def run_episodes(backend: GenerationBackend, tokenizer: Any, envs: TextEnvBatch, seeds: Sequence[int],
                 group_ids: Sequence[int], cfg: EpisodeConfig,
                 first_traj_id: int = 0) -> tuple[list[Trajectory], EpisodeStats]:
    """One episode per environment (env i reset with ``seeds[i]``, in GRPO group ``group_ids[i]``); the
    trajectories in environment order (ids ``first_traj_id + i``) and the batch's statistics."""
    if not len(seeds) == len(group_ids) == len(envs):
        raise ValueError(f"{len(seeds)} seeds and {len(group_ids)} group ids for {len(envs)} environments")
    stats = EpisodeStats(trajectories=len(envs))
    t0 = time.perf_counter()
    first = envs.reset(list(seeds))
    stats.env_s += time.perf_counter() - t0
    episodes = []
    for i, step in enumerate(first):
        prompt = _encode(tokenizer, cfg.prompt_template.format(observation=step.observation)) if not step.error else []
        ep = _Episode(Trajectory(first_traj_id + i, i, int(seeds[i]), int(group_ids[i]), prompt))
        if step.error:
            ep.end("env_error", step.error)
        elif not prompt:
            envs.stop(i)
            ep.end("env_error", "the first observation is empty")
        episodes.append(ep)
    for turn in range(cfg.max_turns):
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        budgets = [cfg.max_tokens - len(ep.traj.response_ids) for ep in live]
        params = SamplingParams(n=1, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                max_new_tokens=min(cfg.max_turn_tokens, max(budgets)), stop=cfg.stop,
                                seed=turn_seed(cfg.seed, turn))
        t0 = time.perf_counter()
        groups = backend.generate([ep.context for ep in live], params)
        stats.generate_s += time.perf_counter() - t0
        actions: dict[int, str] = {}
        for ep, budget, group in zip(live, budgets, groups):
            response = group.responses[0]
            ids, logprobs = response.token_ids[:budget], response.logprobs[:budget]
            ep.add(ids, logprobs)
            ep.traj.num_turns += 1
            if len(response.token_ids) > budget or (response.finish_reason == "length" and len(ids) == budget
                                                    and budget < cfg.max_turn_tokens):
                envs.stop(ep.traj.env_index)  # the turn was cut by the budget: not an action to judge
                ep.end("token_budget")
                continue
            text = tokenizer.decode(ids, skip_special_tokens=True)
            ep.traj.turn_texts.append(text)
            actions[ep.traj.env_index] = text
        t0 = time.perf_counter()
        results = envs.step(actions)
        stats.env_s += time.perf_counter() - t0
        for ep in live:
            step = results.get(ep.traj.env_index)
            if step is not None:
                _observe(ep, step, tokenizer, cfg, envs, stats)
    for ep in episodes:
        if not ep.done:
            envs.stop(ep.traj.env_index)
            ep.end("turn_budget")
    trajectories = [ep.traj for ep in episodes]
    for t in trajectories:
        stats.turns += t.num_turns
        stats.model_tokens += t.model_tokens
        stats.observation_tokens += t.observation_tokens
        stats.finish[t.finish_reason] += 1
    stats.env += envs.pop_stats()
    return trajectories, stats


def _observe(ep: _Episode, step: EnvStep, tokenizer: Any, cfg: EpisodeConfig, envs: TextEnvBatch,
             stats: EpisodeStats) -> None:
    """Record one environment step in its episode: the turn's reward, the observation's tokens, the end."""
    traj = ep.traj
    if step.error:
        ep.end("env_error", step.error)
        return
    if "tool_outcome" in step.info:
        stats.tool_outcomes[str(step.info["tool_outcome"])] += 1
    traj.turn_rewards.append(step.reward)
    traj.turn_ends.append(len(traj.response_ids) - 1)
    if step.terminated or step.truncated:
        ep.end("terminated" if step.terminated else "truncated")
        return
    ids = _encode(tokenizer, cfg.observation_template.format(observation=step.observation)) if step.observation else []
    room = cfg.max_tokens - len(traj.response_ids)
    ep.add(ids[:room], None)
    if len(ids) >= room:
        envs.stop(traj.env_index)
        ep.end("token_budget")
