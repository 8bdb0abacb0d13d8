"""Call a function in the caller's process under a time limit, for code that must not hang its caller.

A call that misses its deadline is abandoned, not stopped: Python cannot kill a thread, so it runs on
in a daemon thread (which never blocks the interpreter's exit) and its result is dropped. Use it for
work that is cheap when it behaves (a text environment's step, an arithmetic tool); code that may burn
CPU or memory for ever belongs in a process of the sandbox pool (``sandbox.py``), which is killed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
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


def _run(fn: Callable[..., Any], args: Sequence[Any], box: list[CallResult], in_thread: bool = True) -> None:
    try:
        box.append(CallResult("ok", value=fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a counted outcome
        if not in_thread and not isinstance(exc, Exception):
            raise  # Ctrl-C and exits in the caller's own thread are the caller's
        box.append(CallResult("error", error=f"{type(exc).__name__}: {exc}"[:500], exception=exc))


def call_with_deadline(fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> CallResult:
    """``fn(*args)`` in this thread (no limit) or in a daemon thread waited on for ``timeout_s`` seconds;
    never raises for what ``fn`` does."""
    return call_all_with_deadline([(fn, args)], timeout_s)[0]


def call_all_with_deadline(calls: Sequence[tuple[Callable[..., Any], Sequence[Any]]],
                           timeout_s: float | None = None) -> list[CallResult]:
    """Each ``fn(*args)`` of ``calls``: in turn in this thread when ``timeout_s`` is None, else side by side,
    one daemon thread each, every call given ``timeout_s`` from the moment all have started."""
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    boxes: list[list[CallResult]] = [[] for _ in calls]
    if timeout_s is None:
        for (fn, args), box in zip(calls, boxes):
            _run(fn, args, box, in_thread=False)
        return [box[0] for box in boxes]
    threads = [threading.Thread(target=_run, args=(fn, args, box), daemon=True,
                                name=f"deadline-{getattr(fn, '__name__', 'call')}")
               for (fn, args), box in zip(calls, boxes)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [box[0] if box else CallResult("timeout", error=f"no result within {timeout_s:g}s") for box in boxes]
