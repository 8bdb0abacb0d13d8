"""Call a function in the caller's process under a time limit, for code that must not hang its caller.

A call that misses its deadline is abandoned, not stopped: Python cannot kill a thread, so it runs on
in a daemon thread (which never blocks the interpreter's exit) and its result is dropped. Use it for
work that is cheap when it behaves (a text environment's step, an arithmetic tool); code that may burn
CPU or memory for ever belongs in a process of the sandbox pool (``sandbox.py``), which is killed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

CallStatus = Literal["ok", "error", "timeout"]


@dataclass
class CallResult:
    """How a call ended: ``value`` when ``ok``, ``error`` (type and message) when it raised or timed out."""

    status: CallStatus
    value: Any = None
    error: str = ""
    exception: BaseException | None = None


def call_with_deadline(fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> CallResult:
    """``fn(*args)`` in this thread (no limit) or in a daemon thread waited on for ``timeout_s`` seconds;
    never raises for what ``fn`` does."""
    if timeout_s is None:
        try:
            return CallResult("ok", value=fn(*args))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a counted outcome
            return CallResult("error", error=f"{type(exc).__name__}: {exc}"[:500], exception=exc)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    box: list[CallResult] = []

    def run() -> None:
        try:
            box.append(CallResult("ok", value=fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting caller
            box.append(CallResult("error", error=f"{type(exc).__name__}: {exc}"[:500], exception=exc))

    thread = threading.Thread(target=run, name=f"deadline-{getattr(fn, '__name__', 'call')}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive() or not box:
        return CallResult("timeout", error=f"no result within {timeout_s:g}s")
    return box[0]
