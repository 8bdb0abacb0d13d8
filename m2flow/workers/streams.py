"""One edge of the workflow: a channel whose items go to consumer rank ``slot % consumers``.

Items carry the ``slot`` of their prompt in the iteration (0..G-1). Because routing depends on the
slot only, every consumer rank knows how many items an iteration brings it, so an iteration needs no
end-of-stream marker, one channel serves the whole run, and which rank trains which group is
deterministic (runs and resumed runs see the same data in the same places).
"""

from __future__ import annotations

from typing import Any, Protocol

from m2flow.runtime.channel import Channel
from m2flow.runtime.trace import get_tracer


class _Routed(Protocol):
    slot: int


class GroupStream:
    """Put routed items in; consumer ``rank`` takes its own, all at once or as they become ready."""

    def __init__(self, channel: Channel, consumers: int) -> None:
        if consumers < 1:
            raise ValueError(f"a stream needs at least one consumer rank, got {consumers}")
        self.channel = channel
        self.consumers = consumers

    @classmethod
    def create(cls, name: str, consumers: int) -> GroupStream:
        """A stream over a new channel called ``name`` (unbounded: an iteration's data always fits)."""
        return cls(Channel.create(name), consumers)

    @property
    def name(self) -> str:
        return self.channel.name

    def key(self, slot: int) -> int:
        """The consumer rank of ``slot``."""
        return slot % self.consumers

    def expected(self, rank: int, num_slots: int) -> int:
        """How many of an iteration's ``num_slots`` items go to consumer ``rank``."""
        return len(range(rank, num_slots, self.consumers))

    def put(self, item: _Routed) -> None:
        """Send ``item`` to the consumer rank of its slot."""
        self.channel.put(item, weight=1, key=self.key(item.slot))

    def take(self, rank: int, count: int) -> list[Any]:
        """Exactly ``count`` items for ``rank``, blocking until they are all there."""
        if count <= 0:
            return []
        with get_tracer().span(f"wait {self.name}", cat="wait_channel", items=count):
            return list(self.channel.get_batch(count, key=rank))

    def take_ready(self, rank: int, limit: int) -> list[Any]:
        """Between 1 and ``limit`` items for ``rank``: blocks for the first, then adds what is already queued.

        This is the elastic micro-batch: big when producers are ahead, small when they are behind.
        """
        if limit <= 0:
            return []
        with get_tracer().span(f"wait {self.name}", cat="wait_channel"):
            first = self.channel.get(key=rank)
        ready = min(limit - 1, self.channel.qsize(key=rank))
        return [first] + (list(self.channel.get_batch(ready, key=rank)) if ready > 0 else [])

    def close(self) -> None:
        """End the stream (consumers blocked on it get ``ChannelClosed``)."""
        self.channel.close()

    def __repr__(self) -> str:
        return f"GroupStream({self.name!r}, consumers={self.consumers})"
