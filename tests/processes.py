"""Helpers for tests that watch processes from outside."""

from __future__ import annotations

import time
from pathlib import Path


def process_gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def rank_pid(group_prefix: str, rank: int = 0, namespace: str = "m2flow") -> int:
    """The process id of rank ``rank`` of the running group named ``group_prefix-<run>``."""
    from m2flow.runtime import WorkerGroup, host_pool

    name = next(g for g in host_pool.groups(namespace) if g.startswith(group_prefix + "-"))
    return WorkerGroup.attach(name, namespace=namespace).pids()[rank]
