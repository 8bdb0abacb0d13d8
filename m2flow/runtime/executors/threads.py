"""In-process ranks: a dedicated thread per rank that runs its calls one at a time, and their handles.

``RankThread`` gives a worker object what a Ray actor gives it: its calls run in submission order,
one after another, on one thread of its own, while other ranks' threads run theirs at the same time.
``LocalHandle`` is ``GroupHandle`` for futures: ``.wait()`` or ``await``, results in rank order, the
first failure raised at once as the ``WorkerError`` the rank returned.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from typing import Any

from ray.exceptions import GetTimeoutError

from m2flow.runtime.handle import CallFailure

log = logging.getLogger(__name__)

_STOP = object()


class RankThread:
    """One rank's thread: ``submit(fn, *args)`` queues a call and returns its future at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int:
        """The thread's identifier (``threading.get_ident()`` inside its calls)."""
        assert self._thread.ident is not None
        return self._thread.ident

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on this thread after every call submitted before it."""
        if not self._thread.is_alive():
            raise RuntimeError(f"{self.name} is stopped")
        fut: Future = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - the caller decides what a failure means
                fut.set_exception(e)

    def stop(self, timeout: float) -> bool:
        """Stop after the calls already queued; False when they are still running after ``timeout``."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
        return not self._thread.is_alive()


class LocalHandle:
    """The pending results of one method called on some in-process ranks of a group."""

    def __init__(self, futures: Sequence[Future], ranks: Sequence[int],
                 describe_rank: Callable[[int], tuple[str, int, str]], method: str) -> None:
        self._futures = list(futures)
        self.ranks = list(ranks)
        self._describe = describe_rank  # rank -> (group, rank, node) for error messages
        self.method = method
        self._results: list[Any] | None = None

    def describe(self, rank: int) -> tuple[str, int, str]:
        """(group, rank, node) of one of the called ranks, for error messages."""
        return self._describe(rank)

    def done(self) -> bool:
        """True when every rank has finished (successfully or not)."""
        return all(f.done() for f in self._futures)

    @staticmethod
    def _unpack(fut: Future) -> Any:
        value = fut.result()  # the rank host returns failures as values; anything raised is a bug
        if isinstance(value, CallFailure):
            raise value.error
        return value

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until all ranks finish; results in rank order. The first failure raises at once."""
        if self._results is not None:
            return self._results
        index = {id(f): i for i, f in enumerate(self._futures)}
        out: list[Any] = [None] * len(self._futures)
        pending = set(self._futures)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = wait_futures(pending, timeout=left, return_when=FIRST_COMPLETED)
            if not done:
                raise GetTimeoutError(
                    f"{self.method}() still running on ranks "
                    f"{sorted(self.ranks[index[id(f)]] for f in pending)} after {timeout}s")
            # In rank order, so that of several failures at once the lowest rank's is raised.
            for fut in sorted(done, key=lambda f: index[id(f)]):
                out[index[id(fut)]] = self._unpack(fut)
        self._results = out
        return out

    async def _async_wait(self) -> list[Any]:
        if self._results is not None:
            return self._results
        wrapped = {asyncio.wrap_future(f): i for i, f in enumerate(self._futures)}
        out: list[Any] = [None] * len(self._futures)
        pending = set(wrapped)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: wrapped[f]):
                out[wrapped[fut]] = self._unpack(self._futures[wrapped[fut]])
        self._results = out
        return out

    def __await__(self):
        return self._async_wait().__await__()

    def __repr__(self) -> str:
        return f"LocalHandle({self.method}, ranks={self.ranks})"
