"""Any reward function run in the sandbox pool, under the same time limit and isolation as ``math``.

A user reward (``reward.fn: module:function``) or a registered one is code the run does not control:
it may hang, raise, kill its process or return NaN. ``score_isolated`` runs it in the sandbox pool
(``sandbox.py``), so a check is killed at its deadline and a crash takes down only a pool worker.
Every failure scores 0.0 and is counted by kind in ``VerifyStats``: ``timeouts``, ``errors`` (it
raised), ``crashes`` (its process died) and ``invalid`` (NaN, an infinity, or no number).

A per-sample function gets one sandboxed call per response, each under the time limit. A batched
one gets one call for the whole batch under the time limit; if that call fails, every response of
the batch scores 0 and counts as failed. A batched function that returns the wrong number of scores
is a bug in it, not a bad check, and raises ``RewardOutputError``.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Callable, Sequence
from typing import Any

from m2flow.rewards.sandbox import SandboxPool, SandboxResult, VerifyStats, default_pool

logger = logging.getLogger(__name__)

FAILED_SCORE = 0.0
"""The score of a check that timed out, raised, crashed or returned no finite number."""


def finite_score(value: Any) -> float | None:
    """``value`` as a finite float (bools count), or None when it is not one."""
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        try:
            value = value.item()  # a one-element tensor or numpy scalar
        except (TypeError, ValueError, RuntimeError):
            return None
    if not isinstance(value, numbers.Real):
        return None
    score = float(value)
    return score if math.isfinite(score) else None


def score_isolated(
    responses: Sequence[str],
    references: Sequence[str],
    *,
    fn: Callable[..., Any],
    batched: bool = False,
    name: str = "",
    pool: SandboxPool | None = None,
    timeout_s: float | None = None,
) -> tuple[list[float], VerifyStats]:
    """Scores (B,) of ``fn`` over B responses and references, each check sandboxed; never raises for a
    check that fails (see the module docstring), only for a batched result of the wrong length."""
    from m2flow.rewards.registry import RewardOutputError  # the registry imports this module's users

    start = time.perf_counter()
    pool = pool or default_pool()
    n = len(responses)
    if batched:
        results, stats = pool.map(fn, [(list(responses), list(references))], timeout_s=timeout_s)
        stats.total = n
        stats.sandboxed, stats.in_process = (n, 0) if stats.sandboxed else (0, n)  # an InlinePool runs in process
        only = results[0]
        if only.status != "ok":
            _count_failed_batch(stats, only, n, name)
            stats.seconds = time.perf_counter() - start
            return [FAILED_SCORE] * n, stats
        values = only.value.tolist() if hasattr(only.value, "tolist") else only.value
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
            got = f"{len(values)} scores" if isinstance(values, Sequence) else type(values).__name__
            raise RewardOutputError(f"reward.fn: batched reward function {name!r} returned {got} for {n} samples")
        results = [SandboxResult("ok", value=v) for v in values]
    else:
        results, stats = pool.map(fn, list(zip(responses, references)), timeout_s=timeout_s)
    scores = [FAILED_SCORE] * n
    told = False
    for i, result in enumerate(results):
        if result.status != "ok":  # counted by the pool; the first failure of a batch is told
            if not told:
                logger.warning("reward %s: check of sample %d failed (%s%s); scored %s", name, i, result.status,
                               f": {result.error}" if result.error else "", FAILED_SCORE)
                told = True
            continue
        score = finite_score(result.value)
        if score is None:
            stats.invalid += 1
            logger.warning("reward %s returned %r for sample %d; scored %s", name, result.value, i, FAILED_SCORE)
        else:
            scores[i] = score
    stats.seconds = time.perf_counter() - start
    return scores, stats


def _count_failed_batch(stats: VerifyStats, result: SandboxResult, n: int, name: str) -> None:
    """Count every response of a batch whose one call failed under that call's kind of failure."""
    kind = {"timeout": "timeouts", "error": "errors", "crash": "crashes"}[result.status]
    stats.timeouts = stats.errors = stats.crashes = 0
    setattr(stats, kind, n)
    logger.warning("batched reward %s failed (%s: %s); its %d responses scored %s", name, result.status,
                   result.error, n, FAILED_SCORE)
