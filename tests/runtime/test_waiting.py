"""``gather``, every flow's wait: results in handle order, the first failure at once, a late handle named
as hung past the deadline. Handles here are stand-ins in this process (the ``Handle`` protocol), no Ray."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from ray.exceptions import GetTimeoutError

from m2flow.runtime.errors import WorkerError, WorkerHungError
from m2flow.runtime.waiting import gather


class FakeHandle:
    """A call on ranks of group ``group`` that answers ``value`` (or raises ``error``) after ``delay`` seconds."""

    def __init__(self, group: str, value: Any = None, delay: float = 0.0, error: Exception | None = None) -> None:
        self.group, self.value, self.delay, self.error = group, value, delay, error
        self.ranks, self.method = [0], "work"
        self.finished = False

    def describe(self, rank: int) -> tuple[str, int, str]:
        return self.group, rank, "node-0"

    def done(self) -> bool:
        return self.finished

    def wait(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and self.delay > timeout:
            time.sleep(timeout)
            raise GetTimeoutError(f"{self.method}() still running")
        time.sleep(self.delay)
        return self._result()

    def _result(self) -> list[Any]:
        self.finished = True
        if self.error is not None:
            raise self.error
        return [self.value]

    async def _wait(self) -> list[Any]:
        await asyncio.sleep(self.delay)
        return self._result()

    def __await__(self):
        return self._wait().__await__()


def test_results_come_in_handle_order_whatever_order_they_finish_in():
    handles = [FakeHandle("a", 1, delay=0.05), FakeHandle("b", 2), FakeHandle("c", 3, delay=0.02)]
    assert gather(handles) == [[1], [2], [3]]
    assert gather(handles[:1], timeout=1.0) == [[1]]
    assert gather([]) == []


def test_the_first_failure_raises_without_waiting_for_the_others():
    failure = WorkerError("b", 0, "node-0", "boom")
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="boom"):
        gather([FakeHandle("a", delay=5.0), FakeHandle("b", error=failure)], timeout=10.0)
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("several", [False, True])
def test_a_handle_past_the_deadline_is_named_as_hung(several):
    late = FakeHandle("slow", delay=5.0)
    handles = [FakeHandle("quick", 1), late] if several else [late]
    with pytest.raises(WorkerHungError) as caught:
        gather(handles, timeout=0.1, what="a checkpoint")
    error = caught.value
    assert (error.group, error.rank) == ("slow", 0)
    assert "work() gave no result within 0.1s during a checkpoint" in str(error)
