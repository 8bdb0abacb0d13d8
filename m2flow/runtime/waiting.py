"""Waiting on the handles of calls to several groups at once, with a deadline: every flow's ``gather``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ray.exceptions import GetTimeoutError

from m2flow.runtime.errors import WorkerHungError
from m2flow.runtime.executors.base import Handle


def gather(handles: Sequence[Handle], timeout: float | None = None, what: str = "") -> list[list[Any]]:
    """Results of every handle, in order; the first failure anywhere raises at once (the others would
    wait forever). Past ``timeout`` seconds the handles still running raise ``WorkerHungError``
    (``what``: the part of the run that waited, for the message)."""
    def hung(late: Handle) -> WorkerHungError:
        group, rank, node = late.describe(late.ranks[0])
        where = f" during {what}" if what else ""
        return WorkerHungError(group, rank, node, f"{late.method}() gave no result within {timeout:g}s{where} "
                               "(fault_tolerance.iteration_timeout_s)")

    async def all_of() -> list[list[Any]]:
        return list(await asyncio.gather(*handles))

    async def bounded() -> list[list[Any]]:
        try:
            return await asyncio.wait_for(all_of(), timeout)
        except asyncio.TimeoutError:
            raise hung(next(h for h in handles if not h.done())) from None

    if not handles:
        return []
    if len(handles) == 1:
        # One handle needs no event loop (building one costs about a millisecond; a turn loop waits on
        # one handle several times per iteration): its own wait raises its first failure too.
        try:
            return [handles[0].wait(timeout)]
        except GetTimeoutError:
            raise hung(handles[0]) from None
    return asyncio.run(all_of() if timeout is None else bounded())
