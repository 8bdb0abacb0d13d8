"""Call a function in the caller's process under a time limit, for code that must not hang its caller.

``call_all_with_deadline`` starts a daemon thread per call; ``DeadlineRunner`` keeps one thread that runs
batches of calls in turn, for the calls made at every step (an environment's step, a tool call), where
starting a thread and handing over to it per call costs more than the call itself.

A call that misses its deadline is abandoned, not stopped: Python cannot kill a thread, so it runs on
in a daemon thread (which never blocks the interpreter's exit) and its result is dropped. Use it for
work that is cheap when it behaves (a text environment's step, an arithmetic tool); code that may burn
CPU or memory for ever belongs in a process of the sandbox pool (``sandbox.py``), which is killed.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

CallStatus = Literal["ok", "error", "timeout"]

_here = threading.local()


def under_deadline() -> bool:
    """Whether this thread runs calls under a deadline (a ``DeadlineRunner``'s or ``call_all_with_deadline``'s)."""
    return getattr(_here, "under_deadline", False)


@dataclass
class CallResult:
    """How a call ended: ``value`` when ``ok``, ``error`` (type and message) when it raised or timed out."""

    status: CallStatus
    value: Any = None
    error: str = ""
    exception: BaseException | None = None


def _run(fn: Callable[..., Any], args: Sequence[Any], box: list[CallResult], in_thread: bool = True) -> None:
    if in_thread:
        _here.under_deadline = True
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


@dataclass
class _Job:
    """A batch of calls for the runner thread: the results so far and the call running, as one tuple."""

    calls: Sequence[tuple[Callable[..., Any], Sequence[Any]]]
    results: list[CallResult | None]
    current: tuple[int, float] = (0, 0.0)  # (index of the call running, its start), replaced whole: read unlocked
    done: bool = False
    abandoned: bool = False


class _RunnerState:
    """What the runner thread shares with its owner (never the owner itself, so the owner can be collected)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.job: _Job | None = None
        self.closed = False

    def loop(self) -> None:
        """The runner thread: wait for a job, run its calls in turn, hand back the results; exit when closed
        or when a call of its job was abandoned (the thread was given up on while in that call)."""
        _here.under_deadline = True
        while True:
            with self.cond:
                while self.job is None and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                job = self.job
            if not self._run(job):
                return

    def _run(self, job: _Job) -> bool:
        """Run ``job``'s calls in turn; False when the owner gave up on one of them."""
        for index in range(job.current[0], len(job.calls)):
            fn, args = job.calls[index]
            box: list[CallResult] = []
            _run(fn, args, box)
            with self.cond:
                if job.abandoned:
                    return False  # the owner timed this call out and went on without this thread
                job.results[index] = box[0]
                if index + 1 < len(job.calls):
                    job.current = (index + 1, time.monotonic())
        with self.cond:
            if job.abandoned:
                return False
            job.done = True
            if self.job is job:
                self.job = None
            self.cond.notify_all()
        return True


class DeadlineRunner:
    """One long-lived daemon thread that runs batches of calls in turn, each call under a time limit.

    ``run_all(calls)`` hands the whole batch to the thread and waits once: a thread hand-off per batch, not
    a thread started per call. A call still running ``timeout_s`` after it began is marked ``timeout`` and
    abandoned with its thread (which exits if the call ever returns); a fresh thread runs the calls after
    it. The thread starts at the first batch and exits when the runner is closed or collected.
    """

    def __init__(self, timeout_s: float, name: str = "deadline-runner") -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s, self.name = timeout_s, name
        self.abandoned = 0
        """Threads given up on (each left in a call that missed its limit)."""
        self._state: _RunnerState | None = None
        self._finalizer: weakref.finalize | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s, "name": self.name, "abandoned": self.abandoned}  # not the thread

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["timeout_s"], state["name"])
        self.abandoned = state["abandoned"]

    def _start(self) -> _RunnerState:
        state = _RunnerState()
        threading.Thread(target=state.loop, daemon=True, name=self.name).start()
        self._state = state
        self._finalizer = weakref.finalize(self, _close_state, state)
        return state

    def run_all(self, calls: Sequence[tuple[Callable[..., Any], Sequence[Any]]]) -> list[CallResult]:
        """Each ``fn(*args)`` of ``calls`` in turn on the runner thread; every call given ``timeout_s`` from its
        own start. Never raises for what a call does."""
        results: list[CallResult | None] = [None] * len(calls)
        start = 0
        while start < len(calls):
            if self._state is not None and self._state.job is not None:  # a batch left by an interrupted wait
                self.close()
            state = self._state if self._state is not None else self._start()
            job = _Job(calls, results, current=(start, time.monotonic()))
            with state.cond:
                state.job = job
                state.cond.notify_all()
                while not job.done:
                    index, began = job.current
                    left = began + self.timeout_s - time.monotonic()
                    if left <= 0:  # the call running now missed its limit: give up on it and on this thread
                        job.abandoned, state.job = True, None
                        results[index] = CallResult("timeout", error=f"no result within {self.timeout_s:g}s")
                        break
                    state.cond.wait(left)  # woken when the batch ends; on waking early, the next call's limit
            if job.done:
                break
            self.close()  # the abandoned thread exits if its call ever returns
            self.abandoned += 1
            start = index + 1
        return [r if r is not None else CallResult("timeout", error="not run") for r in results]

    def close(self) -> None:
        """Let the runner thread exit once it is idle (a later batch starts a new one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._state, self._finalizer = None, None


def _close_state(state: _RunnerState) -> None:
    with state.cond:
        state.closed = True
        state.cond.notify_all()


class PendingCalls:
    """Calls started one at a time, a daemon thread each, and taken back as they finish: for steps that wait (a
    tool's latency) where the caller goes on with the calls that have answered instead of waiting for all.

    Each call has ``timeout_s`` from its own start; one still running past it is taken back as ``timeout`` and
    abandoned with its thread (whatever it returns later is dropped). Calls are keyed (an environment's index):
    one call per key at a time.
    """

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._started: dict[Any, tuple[float, object]] = {}  # key -> (start, the call's token)
        self._done: dict[Any, CallResult] = {}

    def start(self, key: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` in a thread of its own under ``key`` (no call of that key may be out)."""
        token = object()
        with self._cond:
            if key in self._started:
                raise ValueError(f"a call of {key!r} is out already")
            self._started[key] = (time.monotonic(), token)

        def run() -> None:
            box: list[CallResult] = []
            _run(fn, args, box)
            with self._cond:
                entry = self._started.get(key)
                if entry is not None and entry[1] is token:  # not abandoned (nor dropped) meanwhile
                    self._done[key] = box[0]
                    self._cond.notify_all()

        threading.Thread(target=run, daemon=True, name=f"pending-{getattr(fn, '__name__', 'call')}").start()

    def out(self) -> list[Any]:
        """The keys whose calls are out (started, not taken back)."""
        with self._cond:
            return list(self._started)

    def take(self, wait: bool = True, linger_s: float = 0.0) -> dict[Any, CallResult]:
        """The calls that have ended (or passed their limit), taken back; with ``wait``, when calls are out and
        none has ended, first wait until one ends or passes its limit, and go on waiting for the others up to
        ``linger_s`` from the call (taking more answers at once when they come close together)."""
        linger_until = time.monotonic() + linger_s
        with self._cond:
            while wait and len(self._done) < len(self._started):
                now = time.monotonic()
                left = min(t for t, _ in self._started.values()) + self.timeout_s - now
                if left <= 0 or (self._done and now >= linger_until):
                    break
                self._cond.wait(min(left, linger_until - now) if self._done else left)
            out, self._done = self._done, {}
            now = time.monotonic()
            for key in out:
                del self._started[key]
            for key, (began, _) in list(self._started.items()):
                if now - began >= self.timeout_s:  # abandoned: its thread's later result is dropped
                    del self._started[key]
                    out[key] = CallResult("timeout", error=f"no result within {self.timeout_s:g}s")
            return out

    def drop(self, key: Any) -> bool:
        """Wait for ``key``'s call to end, within its limit, and drop its result (the caller starts over); False
        when it did not end in time (abandoned: its thread may still be in the call)."""
        with self._cond:
            if key not in self._started:
                return True
            began = self._started[key][0]
            while key not in self._done:
                left = began + self.timeout_s - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            ended = self._done.pop(key, None) is not None
            del self._started[key]
            return ended
