"""Waiting on workers with a deadline, and restarting a run after a worker died or hung."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ray.exceptions import GetTimeoutError

from m2flow.driver.run_config import FaultToleranceConfig
from m2flow.runtime.errors import WorkerHungError, worker_died
from m2flow.runtime.executors import Handle

log = logging.getLogger(__name__)


def gather(handles: Sequence[Handle], timeout: float | None = None, what: str = "") -> list[list[Any]]:
    """Results of every handle, in order; the first failure anywhere raises at once (the others would
    wait forever). Past ``timeout`` seconds the handles still running raise ``WorkerHungError``
    (``what``: the part of the run that waited, for the message)."""
    def hung(late: Handle) -> WorkerHungError:
        group, rank, node = late.describe(late.ranks[0])
        where = f" during {what}" if what else ""
        return WorkerHungError(group, rank, node, f"{late.method}() gave no result within {timeout:g}s{where} "
                               "(fault_tolerance.iteration_timeout_s)")

    async def all_of() -> list[list[Any]]:
        return list(await asyncio.gather(*handles))

    async def bounded() -> list[list[Any]]:
        try:
            return await asyncio.wait_for(all_of(), timeout)
        except asyncio.TimeoutError:
            raise hung(next(h for h in handles if not h.done())) from None

    if not handles:
        return []
    if len(handles) == 1:
        # One handle needs no event loop (building one costs about a millisecond; a turn loop waits on
        # one handle several times per iteration): its own wait raises its first failure too.
        try:
            return [handles[0].wait(timeout)]
        except GetTimeoutError:
            raise hung(handles[0]) from None
    return asyncio.run(all_of() if timeout is None else bounded())


R = TypeVar("R")


def run_with_restarts(attempt: Callable[[int], R], run_dir: str | Path, config: FaultToleranceConfig) -> R:
    """``attempt(restarts)`` until it returns; after a worker died or hung, again (the attempt resumes the
    newest checkpoint of its own run, or starts over), at most ``config.max_restarts`` times. Any other
    error, or one death too many, propagates."""
    restarts = 0
    while True:
        try:
            return attempt(restarts)
        except Exception as error:  # noqa: BLE001 - only deaths are retried, everything else re-raised
            if not worker_died(error) or restarts >= config.max_restarts:
                raise
            restarts += 1
            log.warning("restart %d of %d after: %s%s", restarts, config.max_restarts, str(error).splitlines()[0],
                        _last_log_lines(run_dir, error))


def _last_log_lines(run_dir: str | Path, error: BaseException, lines: int = 8) -> str:
    """The end of the failed worker's own log file (``run_dir/logs/GROUP.RANK.log``), indented, if any."""
    group, rank = getattr(error, "group", None), getattr(error, "rank", None)
    path = Path(run_dir) / "logs" / f"{group}.{rank}.log"
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"\n  last lines of {path}:\n" + "\n".join(f"    {line}" for line in tail) if tail else ""
