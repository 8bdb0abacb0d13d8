"""Top-level reward checks for the sandbox tests (worker processes import them by name).

Kept free of heavy imports: a worker imports this module on its first call, inside the time limit.
"""

from __future__ import annotations

import os
import time
import uuid

_PROCESS = f"{os.getpid()}-{uuid.uuid4().hex}"  # a confined worker is PID 1 of its own namespace: pids repeat


def slow_check(response: str, reference: str) -> float:
    """Never answers in time: stands in for a comparison that hangs."""
    time.sleep(60)
    return 1.0


def crashing_check(response: str, reference: str) -> float:
    """Kills its own process, as a segfault in a native library would."""
    os._exit(7)


def raising_check(response: str, reference: str) -> float:
    raise RuntimeError("checker bug")


def worker_pid(response: str, reference: str) -> str:
    """Which worker process ran the call (unique per process, confined or not)."""
    return _PROCESS


def equal_check(response: str, reference: str) -> float:
    return float(response == reference)


def text_check(response: str, reference: str) -> str:
    return "yes"
