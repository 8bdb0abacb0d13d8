"""Handles for asynchronous operations and per-peer ordered inboxes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from m2flow.runtime.comm.errors import CommTimeout

_POLL_S = 1.0  # how often a long wait checks that its peer is still alive


class CommWork:
    """An operation in flight: ``wait()`` blocks for its result, ``await`` works too."""

    def __init__(self, futures: Future | list[Future], check: Callable[[], None] | None = None, what: str = "") -> None:
        self._futures = futures if isinstance(futures, list) else [futures]
        self._single = not isinstance(futures, list)
        self._check = check
        self._what = what

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def wait(self, timeout: float | None = None) -> Any:
        """The result (the received object for a receive, ``None`` for a send)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results = []
        for fut in self._futures:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                step = _POLL_S if left is None else min(_POLL_S, left)
                try:
                    results.append(fut.result(timeout=step))
                    break
                except FutureTimeout:
                    if left is not None and left <= step:
                        raise CommTimeout(f"{self._what or 'operation'} timed out after {timeout}s") from None
                    if self._check is not None:
                        self._check()
        return results[0] if self._single else results

    def __await__(self) -> Generator[Any, None, Any]:
        async def _wait() -> Any:
            while not self.done():
                await asyncio.wait(
                    [asyncio.wrap_future(f) for f in self._futures if not f.done()], timeout=_POLL_S
                )
                if not self.done() and self._check is not None:
                    self._check()
            return self.wait()

        return _wait().__await__()


def done_work(result: Any = None) -> CommWork:
    fut: Future = Future()
    fut.set_result(result)
    return CommWork(fut)


class Inbox:
    """Messages from one peer in arrival order; each receive claims the next sequence number.

    Claiming at call time (not at completion) keeps several outstanding asynchronous receives in
    the order they were posted, whichever one is waited on first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[int, Future] = {}
        self._arrived = 0
        self._claimed = 0
        self._error: BaseException | None = None
        self.connected = False

    def deliver(self, obj: Any, error: BaseException | None = None) -> None:
        """The next message from the peer (or, with ``error``, a message that could not be read)."""
        with self._lock:
            seq = self._arrived
            self._arrived += 1
            fut = self._futures.pop(seq, None)
            if fut is None:
                fut = self._futures[seq] = Future()
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(obj)

    def claim(self) -> Future:
        with self._lock:
            seq = self._claimed
            self._claimed += 1
            fut = self._futures.pop(seq, None)
            if fut is not None:
                return fut
            fut = Future()
            if self._error is not None:
                fut.set_exception(self._error)
            else:
                self._futures[seq] = fut
            return fut

    def fail(self, error: BaseException) -> None:
        """No more messages will come: pending and future receives raise ``error``."""
        with self._lock:
            self._error = error
            waiting = [self._futures.pop(s) for s in range(self._arrived, self._claimed) if s in self._futures]
        for fut in waiting:
            fut.set_exception(error)

    @property
    def pending(self) -> int:
        """Messages arrived and not yet received."""
        with self._lock:
            return max(0, self._arrived - self._claimed)

    def revive(self) -> None:
        """The peer reconnected (a restarted process): accept messages again."""
        with self._lock:
            self._error = None
