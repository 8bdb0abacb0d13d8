"""``InlinePool``: the sandbox pool's interface, run in the caller's own process (``reward.isolate: false``).

For a cheap reward the run trusts, the round trip to a sandbox process costs more than the check
(G1's CRC32 parity: ~2.4 ms per batch of 32 sandboxed against ~0.01 ms in process). ``InlinePool``
calls the function directly and reports exactly what the sandbox would for a check that raises
(``errors``) or returns no finite number (counted by the caller as ``invalid``), so the scoring rules,
counts and ``reward.max_error_rate`` stay the same. What it gives up is the isolation: there is no
time limit (a check that hangs hangs its worker, and the run's iteration deadline is what notices)
and a check that kills its process kills the worker (the run's restarts are what recover).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from m2flow.rewards.sandbox import SandboxResult, VerifyStats

logger = logging.getLogger(__name__)


class InlinePool:
    """``SandboxPool.map`` without the sandbox: every call runs in this process, in order."""

    num_workers = 0

    def map(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], timeout_s: float | None = None
    ) -> tuple[list[SandboxResult], VerifyStats]:
        """Run ``fn(*args)`` for each args tuple; a call that raises is an ``error`` result, never raised.
        ``timeout_s`` is accepted for the interface and not enforced."""
        start = time.perf_counter()
        stats = VerifyStats(total=len(calls), in_process=len(calls))
        results: list[SandboxResult] = []
        for args in calls:
            try:
                results.append(SandboxResult("ok", value=fn(*args)))
            except Exception as exc:  # noqa: BLE001 - a user's check may raise anything; it scores 0
                stats.errors += 1
                results.append(SandboxResult("error", error=f"{type(exc).__name__}: {exc}"))
        stats.seconds = time.perf_counter() - start
        return results, stats

    def close(self) -> None:
        """Nothing to stop."""
