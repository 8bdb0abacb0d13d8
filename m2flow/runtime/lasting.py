"""Child processes that a process keeps for its whole life, whatever rank it serves.

A process-wide pool of helper processes that holds nothing of any run (the reward sandbox's default pool of
verifier processes, which cost seconds each to start) says so here, so that a rank process handing itself
back for reuse (``rank_host.RankHost.release``) is not refused for having children: they belong to the
process, not to the worker that started them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

_lock = threading.Lock()
_sources: list[Callable[[], Iterable[int]]] = []


def add(pids: Callable[[], Iterable[int]]) -> None:
    """Declare the live process ids ``pids()`` returns (asked each time) as this process's own helpers."""
    with _lock:
        _sources.append(pids)


def children() -> frozenset[int]:
    """The process ids every declared source names now."""
    with _lock:
        sources = list(_sources)
    return frozenset(pid for source in sources for pid in source())
