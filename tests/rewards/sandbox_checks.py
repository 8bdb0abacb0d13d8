"""Top-level reward checks for the sandbox tests (worker processes import them by name).

Kept free of heavy imports: a worker imports this module on its first call, inside the time limit.
"""

from __future__ import annotations

import os
import time


def slow_check(response: str, reference: str) -> float:
    """Never answers in time: stands in for a comparison that hangs."""
    time.sleep(60)
    return 1.0


def crashing_check(response: str, reference: str) -> float:
    """Kills its own process, as a segfault in a native library would."""
    os._exit(7)


def raising_check(response: str, reference: str) -> float:
    raise RuntimeError("checker bug")


def worker_pid(response: str, reference: str) -> int:
    return os.getpid()


def equal_check(response: str, reference: str) -> float:
    return float(response == reference)


def text_check(response: str, reference: str) -> str:
    return "yes"
