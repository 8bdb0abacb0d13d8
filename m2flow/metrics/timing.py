"""Wall-clock timing of named blocks, reported as ``time/...`` metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager


@contextmanager
def timer(name: str, into: MutableMapping[str, float]) -> Iterator[None]:
    """Add the seconds the block takes to ``into[name]`` (summed when the block runs several times)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into[name] = into.get(name, 0.0) + (time.perf_counter() - start)


class Timings:
    """Accumulates named block times between two ``pop()`` calls: ``with timings("time/step"): ...``."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}

    def __call__(self, name: str):  # -> a context manager
        return timer(name, self._totals)

    def pop(self) -> dict[str, float]:
        """The times gathered since the last pop, in seconds; starts afresh."""
        out, self._totals = self._totals, {}
        return out
