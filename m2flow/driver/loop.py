"""The macro loop, written once for every workflow: start, finish, log, evaluate, checkpoint, stop.

Cadence is the same everywhere: with ``eval_every`` N the policy is evaluated before the first
iteration of a fresh run, after every N-th iteration and after the last; with ``checkpoint_every`` C
a checkpoint follows every C-th iteration and the last. Each iteration's metrics (with the
evaluation after it, if any) are one row at the flow's progress step.

Bounded staleness: with ``max_staleness`` s > 0 iteration ``it`` starts the work of every iteration
up to ``it + s`` not started yet (``collect_horizon``), so producers run ahead while the actor trains;
no work starts past an iteration that is followed by an evaluation, a checkpoint or the end (the
pipeline drains there), so a checkpoint holds nothing in flight and a resumed run equals the
uninterrupted one. A stop request (SIGTERM, or ``watch`` returning true) starts no new work, trains
what was started, saves, and ends the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m2flow.driver.workflow import Flow
from m2flow.runtime.trace import get_tracer


@dataclass(frozen=True)
class Cadence:
    """When a run of ``iterations`` evaluates and checkpoints."""

    iterations: int
    eval_every: int = 0
    checkpoint_every: int = 0

    def evaluates_after(self, it: int) -> bool:
        return bool(self.eval_every) and ((it + 1) % self.eval_every == 0 or it + 1 == self.iterations)

    def checkpoints_after(self, it: int) -> bool:
        return bool(self.checkpoint_every) and ((it + 1) % self.checkpoint_every == 0 or it + 1 == self.iterations)

    def drains(self, it: int) -> bool:
        """Whether nothing may be in flight after iteration ``it``."""
        return it + 1 >= self.iterations or self.evaluates_after(it) or self.checkpoints_after(it)


def collect_horizon(it: int, max_staleness: int, drains: Callable[[int], bool]) -> int:
    """The last iteration whose work may have started by iteration ``it`` under bounded staleness:
    ``it + max_staleness``, but none past an iteration after which nothing may be in flight."""
    horizon = it
    while horizon < it + max_staleness and not drains(horizon):
        horizon += 1
    return horizon


@dataclass
class LoopOutcome:
    """What the loop did: every iteration's metrics, the evaluations by progress step, whether it stopped early."""

    history: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    stopped: bool = False
    checkpoints: list[Any] = field(default_factory=list)


def train_loop(flow: Flow, cadence: Cadence, start: int, logger: Any,
               save: Callable[[int], Any] = lambda next_it: None, *,
               stop: Callable[[], bool] = lambda: False,
               watch: Callable[[int, dict[str, float]], bool] | None = None,
               constants: dict[str, float] | None = None) -> LoopOutcome:
    """Iterations ``start .. cadence.iterations - 1`` of: start, finish, log, evaluate, checkpoint.

    ``save(next_iteration)`` writes a checkpoint; ``stop()`` (SIGTERM) and ``watch(it, metrics)`` (re-planning),
    true after an iteration, end the loop once what was started is trained, with a checkpoint when
    checkpoints are on. ``constants`` join every iteration's row (the run's restarts so far)."""
    out = LoopOutcome()
    if cadence.eval_every and start == 0:  # the policy before any training, the baseline of every curve
        evaluated = flow.evaluate()
        logger.log(evaluated, step=flow.progress())
        out.evaluations.append((flow.progress(), evaluated))
    stopping = False
    for it in range(start, cadence.iterations):
        t0 = time.perf_counter()
        # The iteration marker carries the iteration and the step its metrics row is logged under.
        with get_tracer().span("step", cat="step", iteration=it) as span:
            horizon = it if stopping else collect_horizon(it, flow.max_staleness, cadence.drains)
            flow.start(it, horizon)
            metrics = flow.finish(it)
            span.annotate(step=flow.progress())
        metrics.update(flow.rates(metrics, time.perf_counter() - t0), **(constants or {}))
        if cadence.evaluates_after(it):  # timed on its own: time/ and perf/ describe training only
            evaluated = flow.evaluate()
            metrics.update(evaluated)
            out.evaluations.append((flow.progress(), evaluated))
        logger.log(metrics, step=flow.progress())
        out.history.append(metrics)
        stopping = stopping or stop() or (watch is not None and watch(it, metrics))
        out.stopped = stopping and not flow.in_flight(it)  # what was started is trained first
        if cadence.checkpoints_after(it) or (cadence.checkpoint_every and out.stopped):
            out.checkpoints.append(save(it + 1))
        if out.stopped:
            break
    return out
