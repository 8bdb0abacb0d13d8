"""``RewardWorker``: scores each response with a reward function, under time limits, group by group.

Every reward runs in a sandbox pool with a per-check time limit (``reward.timeout_s``): the ``math``
reward's symbolic checks, and any other reward through ``rewards/isolated.py``; ``reward.isolate:
false`` runs the checks in the worker's own process instead (``rewards/inline.py``), for a cheap
reward the run trusts. Checks that time
out, raise, crash their process or return NaN/inf score 0 and are counted by kind
(``reward/timeouts_count``, ``reward/errors_count``, ``reward/crashes_count``,
``reward/invalid_count``, and ``reward/error_rate`` of all checks); past ``reward.max_error_rate``
of an iteration's checks on one rank the run stops with a ``RunHealthError``. Groups are scored as
they arrive, in batches of whatever is ready. With DAPO's dynamic sampling a group whose rewards are
all equal is marked ``dropped`` and passed on (so every stage still sees every slot).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from m2flow.algorithms import overlong_penalty
from m2flow.rewards.inline import InlinePool
from m2flow.rewards.isolated import score_isolated
from m2flow.rewards.registry import RewardEntry, RewardFunction, load_reward_fn
from m2flow.rewards.sandbox import SandboxPool, VerifyStats, score_batch
from m2flow.runtime.errors import RunHealthError
from m2flow.runtime.trace import trace_category
from m2flow.runtime.worker import Worker
from m2flow.workers.config import RewardConfig
from m2flow.workers.messages import GroupSample
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.runtime.streams import GroupStream


@dataclass(frozen=True, kw_only=True)
class RewardSettings:
    """The reward: how responses are scored, and the streams a reward rank of its own takes and puts."""

    reward: RewardConfig
    max_new_tokens: int
    """the rollout's limit (the overlong penalty's reference)"""
    dynamic_sampling: bool = False
    """mark groups whose rewards are all equal dropped (DAPO)"""
    responses: GroupStream | None = None
    """where its groups come from (a reward rank of its own; unused when hosted)"""
    scored: GroupStream | None = None
    """where its scored groups go (a reward rank of its own; unused when hosted)"""

    def hosted_in(self, host: Worker) -> GroupScorer:
        """The reward inside the rollout's process (``reward.fuse_with_rollout``): groups leave it scored."""
        return GroupScorer(self)


def build_reward_fn(cfg: RewardConfig, pool: SandboxPool | None = None) -> RewardFunction:
    """The configured reward, every check sandboxed under the configured time limit (in ``pool`` when given),
    or, with ``reward.isolate: false``, run in this process with the same scoring rules and counts."""
    if not cfg.isolate:
        pool = InlinePool()  # type: ignore[assignment] - the same map() interface
    if cfg.fn == "math":
        fn = functools.partial(score_batch, timeout_s=cfg.timeout_s, pool=pool)
        return RewardFunction("math", RewardEntry(fn, batched=True, returns_stats=True))
    user = load_reward_fn(cfg.fn)
    if user.entry.returns_stats:  # a registered reward that keeps its own counts runs as it is
        return user
    fn = functools.partial(score_isolated, fn=user.entry.fn, batched=user.entry.batched, name=cfg.fn,
                           pool=pool, timeout_s=cfg.timeout_s)
    return RewardFunction(cfg.fn, RewardEntry(fn, batched=True, returns_stats=True))


def check_error_rate(stats: VerifyStats, max_error_rate: float, where: str) -> None:
    """Raise ``RunHealthError`` when more than ``max_error_rate`` of the checks in ``stats`` failed."""
    if not stats.total or stats.failures <= max_error_rate * stats.total:
        return
    raise RunHealthError(
        f"{stats.failures} of {stats.total} reward checks failed {where} ({stats.timeouts} timed out, "
        f"{stats.errors} raised, {stats.crashes} crashed, {stats.invalid} returned no finite number), more than "
        f"reward.max_error_rate={max_error_rate:g}; the rank's log names the first failure of each batch")


class GroupScorer:
    """The reward of every response of a group, DAPO's shaping and filter, and the metrics of it all.

    Used by ``RewardWorker`` and, when the plan fuses the reward into the rollout, by the process that
    hosts the rollout (``RewardSettings.hosted_in``).
    """

    def __init__(self, settings: RewardSettings) -> None:
        self.cfg = settings.reward
        self.max_new_tokens = settings.max_new_tokens
        self.dynamic_sampling = settings.dynamic_sampling
        self.fn = build_reward_fn(self.cfg)
        self.reset()

    def reset(self) -> None:
        """Start the counts of a new iteration."""
        self.raw: list[float] = []
        self.final: list[float] = []
        self.dropped = 0
        self.busy = 0.0

    def score(self, groups: list[GroupSample]) -> None:
        """Set ``batch.rewards`` of each group (and ``dropped`` under dynamic sampling)."""
        if not groups:
            return
        t0 = time.perf_counter()
        texts = [t for g in groups for t in g.texts]
        refs = [g.answer or "" for g in groups for _ in g.texts]
        raw = torch.tensor(self.fn(texts, refs), dtype=torch.float32)
        final = raw + self._shaping(groups)
        row = 0
        for g in groups:
            g.batch.rewards = final[row : row + g.size].clone()
            row += g.size
            if self.dynamic_sampling and bool((g.batch.rewards == g.batch.rewards[0]).all()):
                g.dropped = True
                self.dropped += 1
        self.raw.extend(raw.tolist())
        self.final.extend(final.tolist())
        self.busy += time.perf_counter() - t0

    def metrics(self, step: int | None = None) -> dict[str, float]:
        """Reward metrics of what was scored since ``reset``; raises ``RunHealthError`` past the error rate."""
        stats = self.fn.pop_stats()
        check_error_rate(stats, self.cfg.max_error_rate, "in iteration %d" % step if step is not None else "")
        n = max(1, len(self.raw))
        return {
            "reward/mean": sum(self.final) / n,
            "reward/score_mean": sum(self.raw) / n,
            "reward/solved_frac": sum(1.0 for r in self.raw if r >= 1.0) / n,
            "reward/dropped_groups_count": float(self.dropped),
            "reward/timeouts_count": float(stats.timeouts),
            "reward/errors_count": float(stats.errors),
            "reward/crashes_count": float(stats.crashes),
            "reward/invalid_count": float(stats.invalid),
            "reward/error_rate": stats.failures / max(1, stats.total),
            "time/reward": self.busy,
            WEIGHT_KEY: float(len(self.raw)),
        }

    def _shaping(self, groups: list[GroupSample]) -> torch.Tensor:
        """(B,) reward shaping added to the scores: DAPO's overlong penalty when configured, else 0."""
        lengths = torch.cat([g.batch.response_mask.sum(-1) for g in groups])
        if self.cfg.overlong_buffer is None:
            return torch.zeros(len(lengths))
        return overlong_penalty(lengths, max_length=self.max_new_tokens,
                                buffer_length=min(self.cfg.overlong_buffer, self.max_new_tokens),
                                penalty=self.cfg.overlong_penalty).float()


class RewardWorker(Worker):
    """Scores the groups routed to this rank and sends them on."""

    def __init__(self, *, settings: RewardSettings) -> None:
        if settings.responses is None or settings.scored is None:
            raise ValueError("a reward worker of its own needs its responses and scored streams")
        self.inp: GroupStream = settings.responses
        self.out: GroupStream = settings.scored
        self.scorer = GroupScorer(settings)

    @trace_category("reward")
    def score(self, step: int, num_slots: int) -> dict[str, float]:
        """Score this rank's groups of iteration ``step``; returns reward metrics."""
        remaining = self.inp.expected(self.rank, num_slots)
        self.scorer.reset()
        while remaining:
            groups: list[GroupSample] = self.inp.take_ready(self.rank, remaining, step)
            remaining -= len(groups)
            with self.tracer.span("reward", cat="reward", step=step, groups=len(groups)):
                self.scorer.score(groups)
            self.out.put_many(groups)
        return self.scorer.metrics(step)
