"""Asynchronous handles on calls to several ranks: ``.wait()`` or ``await``, results in rank order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from m2flow.runtime.errors import WorkerDiedError, WorkerError


class CallFailure:
    """What a rank sends back instead of a result when its method raised (no Ray exception wrapping)."""

    __slots__ = ("error",)

    def __init__(self, error: WorkerError) -> None:
        self.error = error


class GroupHandle:
    """The pending results of one method called on some ranks of a group."""

    def __init__(
        self,
        refs: Sequence[ray.ObjectRef],
        ranks: Sequence[int],
        describe_rank: Callable[[int], tuple[str, int, str]],
        method: str,
    ) -> None:
        self._refs = list(refs)
        self.ranks = list(ranks)
        self._describe = describe_rank  # rank -> (group, rank, node) for error messages
        self.method = method
        self._results: list[Any] | None = None

    def describe(self, rank: int) -> tuple[str, int, str]:
        """(group, rank, node) of one of the called ranks, for error messages."""
        return self._describe(rank)

    def done(self) -> bool:
        """True when every rank has finished (successfully or not)."""
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def _unpack(self, ref: ray.ObjectRef, rank: int) -> Any:
        try:
            value = ray.get(ref)
        except RayActorError as e:
            group, r, node = self._describe(rank)
            raise WorkerDiedError(
                group, r, node,
                f"its process exited during {self.method}() ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no detail'})",
            ) from None
        if isinstance(value, CallFailure):
            raise value.error
        return value

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until all ranks finish; results in rank order. The first failure raises at once."""
        if self._results is not None:
            return self._results
        index = {ref: i for i, ref in enumerate(self._refs)}
        out: list[Any] = [None] * len(self._refs)
        pending = list(self._refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise GetTimeoutError(
                    f"{self.method}() still running on ranks "
                    f"{sorted(self.ranks[index[r]] for r in pending)} after {timeout}s"
                )
            for ref in ready:
                i = index[ref]
                out[i] = self._unpack(ref, self.ranks[i])
        self._results = out
        return out

    async def _async_wait(self) -> list[Any]:
        if self._results is not None:
            return self._results
        futures = {asyncio.wrap_future(ref.future()): i for i, ref in enumerate(self._refs)}
        out: list[Any] = [None] * len(self._refs)
        pending = set(futures)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = futures[fut]
                fut.exception()  # mark retrieved; _unpack re-raises it with the rank's details
                out[i] = self._unpack(self._refs[i], self.ranks[i])
        self._results = out
        return out

    def __await__(self):
        return self._async_wait().__await__()

    def __repr__(self) -> str:
        return f"GroupHandle({self.method}, ranks={self.ranks})"
