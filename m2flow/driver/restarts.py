"""Restarting a run after a worker died or hung (waiting on workers with a deadline is ``runtime/waiting.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from m2flow.driver.run_config import FaultToleranceConfig
from m2flow.runtime.errors import worker_died

log = logging.getLogger(__name__)


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
