"""The model's side of multi-turn episodes: contexts, budgets and turns, for environments held by whoever steps them.

``TurnEngine`` holds the episodes a rollout rank plays in one iteration and their contexts, and does
the model's half of each round: ``begin`` takes an episode's first observation, ``turn`` generates one
model turn for every running episode (one ``generate`` call) and gives the action texts to hand to the
environments, ``observe`` records what the environments answered. Whoever holds the environments
(``envs/text/batch.py`` in an env worker, or the same process) steps them in between. ``rerun`` puts
episodes back to their start, for an environment that was lost mid-episode: the trajectory keeps its id,
so a re-run episode is delivered once, as if it had run without a fault. With a chat tool format
(``EpisodeConfig.tool_format``, e.g. ``hermes``) the prompt and each observation are the text the tokenizer's
chat template writes around them (``chat.py``); the model's turns are appended as generated either way.

The rounds themselves are ``turn_loop.play_turns``, the one loop for ``run_episodes`` (``episode.py``), the
rollout worker with the environments in its process and the flow over env workers; episodes may be at
different turns in one round (a re-run one starts over).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from m2flow.backends.generation.base import GenerationBackend, SamplingParams
from m2flow.envs.text.batch import EnvStep
from m2flow.envs.text.batch import TextEnvStats
from m2flow.rewards.tools.formats import CALL_FORMATS
from m2flow.workers.agentic.chat import ChatRenderer
from m2flow.workers.agentic.trajectory import FinishReason, Trajectory


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
    stop: tuple[str, ...] | None = None
    """Strings that end a model turn (besides end-of-sequence); None: the tool format's (its call's closing tag)."""
    prompt_template: str = "{observation}"
    """How the first observation becomes the prompt (with a chat format: the user message's text)."""
    observation_template: str = "{observation}"
    """How a later observation is written into the context (an empty observation adds nothing; with a chat
    format: the text of the tool or user message)."""
    tool_format: str = "tag"
    """How the model calls tools (``rewards/tools/formats.py``): ``tag`` (plain text), or ``hermes``, where the
    prompt and observations are rendered with the tokenizer's chat template (``chat.py``)."""
    seed: int = 0
    """Seed of the sampling; the same seed, batch and environments give the same trajectories."""
    reuse_kv: bool = True
    """Keep each episode's keys and values from one turn to the next (backends with continuous batching),
    so a turn runs only the tokens added since the last: the observation and the last generated token."""

    def __post_init__(self) -> None:
        fmt = CALL_FORMATS.get(self.tool_format)  # an unknown name raises, listing the valid ones
        if self.stop is None:
            object.__setattr__(self, "stop", fmt.stop)
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

    def as_metrics(self) -> dict[str, float]:
        n = max(1, self.trajectories)
        out = {"rollout/trajectories": float(self.trajectories), "rollout/turns_mean": self.turns / n,
               "rollout/model_tokens": float(self.model_tokens),
               "rollout/observation_tokens": float(self.observation_tokens)}
        out.update({f"rollout/finish_{k}": float(v) for k, v in sorted(self.finish.items())})
        out.update({f"tool/{k}": float(v) for k, v in sorted(self.tool_outcomes.items())})
        out.update(self.env.as_metrics())
        return out


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode of an iteration: its id, its GRPO group and the seed its environment is reset with."""

    traj_id: int
    slot: int
    """The group's position in the iteration (its group id; routes it to an actor rank)."""
    seed: int
    env_rank: int
    """The env worker that plays it."""


class _Live:
    """An episode being built: the trajectory and the context the model sees."""

    def __init__(self, spec: EpisodeSpec) -> None:
        self.spec = spec
        self.traj = Trajectory(spec.traj_id, spec.env_rank, spec.seed, spec.slot, [])
        self.context: list[int] = []
        self.last_turn: list[int] = []
        """The ids of the model's last turn (a chat template's observation closes it)."""
        self.cache: Any = None
        """The backend's cache of the context's first tokens, from the last turn (``EpisodeConfig.reuse_kv``)."""
        self.started = False
        self.done = False
        self.waiting = False
        """its last turn's action is with the environment, not answered yet (``env.async_steps``)"""

    def end(self, reason: FinishReason, error: str = "") -> None:
        self.traj.finish_reason, self.traj.error, self.done = reason, error, True
        self.cache = None

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None, version: int) -> None:
        self.traj.response_ids.extend(ids)
        self.traj.versions.extend([version] * len(ids))
        self.context.extend(ids)
        self.traj.action_mask.extend([1 if logprobs is not None else 0] * len(ids))
        self.traj.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def episode_seed(seed: int, traj_id: int, turn: int) -> int:
    """The sampling seed of one model turn of one episode: distinct per (seed, trajectory, turn), reproducible."""
    return int(np.random.SeedSequence([seed, traj_id, turn]).generate_state(1)[0] & 0x7FFFFFFF)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


class TurnEngine:
    """The episodes one rollout rank plays in one iteration, keyed by trajectory id."""

    def __init__(self, cfg: EpisodeConfig, tokenizer: Any, specs: Sequence[EpisodeSpec]) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.chat = ChatRenderer(tokenizer) if CALL_FORMATS.get(cfg.tool_format).chat else None
        """The chat template's renderer (a chat tool format), else None: the plain templates."""
        self.episodes = {s.traj_id: _Live(s) for s in specs}
        self.stats = EpisodeStats(trajectories=len(specs))
        self.reruns = 0
        self.version = 0
        """The policy version of the weights playing now: recorded on every token added (``Trajectory.versions``)."""

    def add_episodes(self, specs: Sequence[EpisodeSpec]) -> None:
        """Take more episodes, not started yet, besides those held (partial rollouts: the next iteration's)."""
        for s in specs:
            if s.traj_id in self.episodes:
                raise ValueError(f"trajectory {s.traj_id} is held already")
            self.episodes[s.traj_id] = _Live(s)

    def start_over(self, traj_ids: Sequence[int]) -> None:
        """Put these episodes back to their start, ended or not (partial rollouts: a token too old to train)."""
        for tid in traj_ids:
            self.episodes[tid] = _Live(self.episodes[tid].spec)

    def new_weights(self, version: int) -> None:
        """Play on under weights of ``version``: the keys and values cached under the old ones are dropped (a
        running episode's next turn runs its whole context again)."""
        if version != self.version:
            self.drop_caches()
        self.version = version

    def drop_caches(self) -> None:
        """Let go of every episode's cached keys and values (held episodes between iterations: the devices
        may go to other components meanwhile)."""
        for ep in self.episodes.values():
            ep.cache = None

    def close_some(self, traj_ids: Sequence[int]) -> EpisodeStats:
        """The statistics of these ended episodes, which are let go; the others stay held (partial rollouts)."""
        stats = EpisodeStats(trajectories=len(traj_ids), tool_outcomes=self.stats.tool_outcomes)
        self.stats = EpisodeStats()
        for tid in traj_ids:
            ep = self.episodes.pop(tid)
            if not ep.done:
                raise RuntimeError(f"episode {tid} has not ended")
            t = ep.traj
            stats.turns += t.num_turns
            stats.model_tokens += t.model_tokens
            stats.observation_tokens += t.observation_tokens
            stats.finish[t.finish_reason] += 1
        return stats

    def begin(self, first: Mapping[int, EnvStep]) -> list[int]:
        """Start the episodes whose first observation (reset) is given; the ids of those that ended at once."""
        ended = []
        for tid, step in first.items():
            ep = self.episodes[tid]
            prompt = _encode(self.tokenizer, self._prompt_text(step)) if not step.error else []
            ep.traj.prompt_ids, ep.context, ep.started = prompt, list(prompt), True
            if step.error:
                ep.end("env_error", step.error)
            elif not prompt:
                ep.end("env_error", "the first observation is empty")
            if ep.done:
                ended.append(tid)
        return ended

    def _prompt_text(self, step: EnvStep) -> str:
        text = self.cfg.prompt_template.format(observation=step.observation)
        if self.chat is None:
            return text
        return self.chat.prompt(text, step.info.get("tools"))  # the env's tools, as function schemas

    def _observation_text(self, ep: _Live, step: EnvStep) -> str:
        if self.chat is None:
            return self.cfg.observation_template.format(observation=step.observation) if step.observation else ""
        # A tool's answer is the template's tool message; the task's is the user's next message.
        role = "tool" if "tool_outcome" in step.info else "user"
        return self.chat.observation(self.cfg.observation_template.format(observation=step.observation), role,
                                     ep.last_turn)

    def running(self) -> list[int]:
        """Ids of the started episodes that go on."""
        return [tid for tid, ep in self.episodes.items() if ep.started and not ep.done]

    def turn(self, backend: GenerationBackend, seed: int, seed_base: int | None = None) -> tuple[dict[int, str], list[int]]:
        """One model turn for every running episode not waiting for its environment's answer: the actions to
        step the environments with, and the ids of episodes the token budget ended (their environments get
        nothing). The round is sampled from ``seed``;
        with ``seed_base`` and a backend with continuous batching, each episode's turn from
        ``episode_seed(seed_base, trajectory id, turn)`` instead."""
        live = [ep for ep in (self.episodes[t] for t in self.running()) if not ep.waiting]
        if not live:
            return {}, []
        cfg = self.cfg
        budgets = [cfg.max_tokens - len(ep.traj.response_ids) for ep in live]
        params = SamplingParams(n=1, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                max_new_tokens=min(cfg.max_turn_tokens, max(budgets)), stop=cfg.stop, seed=seed)
        contexts = [ep.context for ep in live]
        if seed_base is not None and getattr(backend, "continuous", False):
            # Each episode's turn drawn from a generator of its own (seed, trajectory, turn): the same episode
            # plays the same turns whatever else shares the batch, so a re-run episode plays as it first did.
            seeds = [episode_seed(seed_base, ep.spec.traj_id, ep.traj.num_turns) for ep in live]
            keep: dict[int, Any] | None = {} if cfg.reuse_kv else None
            prefixes = [ep.cache for ep in live] if cfg.reuse_kv else None
            by_prompt = {g.prompt_index: g for done in backend.generate_stream(contexts, params, seeds, len(contexts),
                                                                               prefixes, keep)
                         for g in done}
            groups = [by_prompt[i] for i in range(len(contexts))]
            if keep is not None:
                for i, ep in enumerate(live):
                    ep.cache = keep.get(i)
        else:
            groups = backend.generate(contexts, params)
        actions: dict[int, str] = {}
        cut = []
        for ep, budget, group in zip(live, budgets, groups):
            response = group.responses[0]
            ids, logprobs = response.token_ids[:budget], response.logprobs[:budget]
            ep.add(ids, logprobs, self.version)
            ep.last_turn = list(ids)
            ep.traj.num_turns += 1
            if len(response.token_ids) > budget or (response.finish_reason == "length" and len(ids) == budget
                                                    and budget < cfg.max_turn_tokens):
                ep.end("token_budget")  # the turn was cut by the budget: not an action to judge
                cut.append(ep.spec.traj_id)
                continue
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            ep.traj.turn_texts.append(text)
            actions[ep.spec.traj_id] = text
            ep.waiting = True
        return actions, cut

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        """Record the environments' answers to the last turn; the ids of episodes that ended (a budget included)."""
        ended = []
        for tid, step in results.items():
            ep = self.episodes[tid]
            self._observe(ep, step)
            if not ep.done and ep.traj.num_turns >= self.cfg.max_turns:
                ep.end("turn_budget")
            if ep.done:
                ended.append(tid)
        return ended

    def _observe(self, ep: _Live, step: EnvStep) -> None:
        traj = ep.traj
        ep.waiting = False
        if step.error:
            ep.end("env_error", step.error)
            return
        if "tool_outcome" in step.info:
            self.stats.tool_outcomes[str(step.info["tool_outcome"])] += 1
        traj.turn_rewards.append(step.reward)
        traj.turn_ends.append(len(traj.response_ids) - 1)
        if step.terminated or step.truncated:
            ep.end("terminated" if step.terminated else "truncated")
            return
        ids = _encode(self.tokenizer, self._observation_text(ep, step))
        room = self.cfg.max_tokens - len(traj.response_ids)
        ep.add(ids[:room], None, self.version)
        if len(ids) >= room:
            ep.end("token_budget")

    def rerun(self, traj_ids: Sequence[int]) -> None:
        """Put these episodes back to their start (their environment was lost); they keep their ids."""
        for tid in traj_ids:
            ep = self.episodes[tid]
            if ep.done:
                raise ValueError(f"trajectory {tid} has ended: it is not re-run")
            self.episodes[tid] = _Live(ep.spec)
            self.reruns += 1

    def trajectory(self, tid: int) -> Trajectory:
        return self.episodes[tid].traj

    def done(self, tid: int) -> bool:
        return self.episodes[tid].done

    def close(self) -> EpisodeStats:
        """The iteration's statistics (every episode must have ended)."""
        open_ = [t for t, ep in self.episodes.items() if not ep.done]
        if open_:
            raise RuntimeError(f"episodes {open_[:8]} have not ended")
        for ep in self.episodes.values():
            t = ep.traj
            self.stats.turns += t.num_turns
            self.stats.model_tokens += t.model_tokens
            self.stats.observation_tokens += t.observation_tokens
            self.stats.finish[t.finish_reason] += 1
        return self.stats
