"""Top-level reward checks for the sandbox tests (worker processes import them by name).

Kept free of heavy imports: a worker imports this module on its first call, inside the time limit.
"""

from __future__ import annotations

import os
import time
import uuid

_PROCESS: dict[int, str] = {}  # pid -> token: confined workers' pids repeat across PID namespaces


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
    return _PROCESS.setdefault(os.getpid(), f"{os.getpid()}-{uuid.uuid4().hex}")


def equal_check(response: str, reference: str) -> float:
    return float(response == reference)


def text_check(response: str, reference: str) -> str:
    return "yes"


def try_read(path: str, reference: str) -> str:
    """The first bytes of ``path``, or the name of the error that refused it (a reward check that snoops)."""
    try:
        with open(path, "rb") as f:
            return f.read(100).decode(errors="replace")
    except OSError as exc:
        return type(exc).__name__


def try_write(path: str, reference: str) -> str:
    """Append to ``path``, or the name of the error that refused it (a reward check that tampers)."""
    try:
        with open(path, "a") as f:
            f.write("tampered")
        return "written"
    except OSError as exc:
        return type(exc).__name__


def environment(response: str, reference: str) -> str:
    return repr(sorted(os.environ.items()))
