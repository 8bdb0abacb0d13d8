"""One edge of the workflow: a channel whose items go to consumer rank ``slot % consumers``.

Items carry the ``slot`` of their prompt in the iteration (0..G-1). Because routing depends on the
slot only, every consumer rank knows how many items an iteration brings it, so an iteration needs no
end-of-stream marker, one channel serves the whole run, and which rank trains which group is
deterministic (runs and resumed runs see the same data in the same places).

``put_many`` sends the items bound for one consumer rank as one channel item (a bundle weighing as
many items as it holds): one message and one wake-up instead of one per item. Consumers unpack
bundles; what a ``take_ready`` unpacked beyond its limit stays with that consumer for its next take.

``keep_local(rank)`` is for a consumer rank that lives in the process producing all of its items and
takes them after they are put (the rollout fused into an actor rank): its items then stay in the
process, never serialised or sent through the channel host.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from m2flow.runtime.channel import Channel
from m2flow.runtime.trace import get_tracer


class _Routed(Protocol):
    slot: int


class _Bundle:
    """Several routed items travelling as one channel item."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


def _unpack(item: Any) -> list[Any]:
    return item.items if isinstance(item, _Bundle) else [item]


_LOCAL: dict[tuple[str, int], deque[Any]] = {}
"""(stream name, consumer rank) -> the items put for that rank in this process and not yet taken."""


class GroupStream:
    """Put routed items in; consumer ``rank`` takes its own, all at once or as they become ready."""

    def __init__(self, channel: Channel, consumers: int) -> None:
        if consumers < 1:
            raise ValueError(f"a stream needs at least one consumer rank, got {consumers}")
        self.channel = channel
        self.consumers = consumers
        self._held: dict[int, deque[Any]] = defaultdict(deque)  # unpacked, not yet taken (this process)

    def __getstate__(self) -> dict[str, Any]:
        # Held items belong to the process that unpacked them; a copy sent elsewhere starts empty.
        return {"channel": self.channel, "consumers": self.consumers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["channel"], state["consumers"])  # type: ignore[misc]

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

    def keep_local(self, rank: int) -> None:
        """Keep the items for consumer ``rank`` in this process: it produces all of them itself, and
        takes them only after putting them (a take that finds too few then raises, as nothing else
        could bring the rest)."""
        _LOCAL.setdefault((self.name, rank), self._held[rank])

    def _box(self, rank: int) -> tuple[deque[Any], bool]:
        """The items of ``rank`` held in this process, and whether that is all it will ever get."""
        local = _LOCAL.get((self.name, rank))
        return (local, True) if local is not None else (self._held[rank], False)

    def put(self, item: _Routed) -> None:
        """Send ``item`` to the consumer rank of its slot."""
        self.put_many([item])

    def put_many(self, items: Iterable[_Routed]) -> None:
        """Send ``items``, one message per consumer rank (in slot order within each)."""
        by_rank: dict[int, list[Any]] = defaultdict(list)
        for item in items:
            by_rank[self.key(item.slot)].append(item)
        for rank, mine in by_rank.items():
            local = _LOCAL.get((self.name, rank))
            if local is not None:
                local.extend(mine)
            elif len(mine) == 1:
                self.channel.put(mine[0], weight=1, key=rank)
            else:
                self.channel.put(_Bundle(mine), weight=len(mine), key=rank)

    def take(self, rank: int, count: int) -> list[Any]:
        """Exactly ``count`` items for ``rank``, blocking until they are all there."""
        if count <= 0:
            return []
        held, local = self._box(rank)
        if local and len(held) < count:
            raise RuntimeError(f"stream {self.name!r}: rank {rank} takes {count} items, but only {len(held)} "
                               "were put in this process (kept local)")
        out = [held.popleft() for _ in range(min(count, len(held)))]
        if len(out) < count:
            with get_tracer().span(f"wait {self.name}", cat="wait_channel", items=count):
                # A batch stops short of the target when the next bundle would overshoot it; the next
                # request then gets that bundle whole (an item heavier than the target comes alone).
                while len(out) < count:
                    got = self.channel.get_batch(count - len(out), key=rank)
                    if not got:
                        raise RuntimeError(f"stream {self.name!r} ended with {len(out)} of {count} items for rank {rank}")
                    for item in got:
                        out.extend(_unpack(item))
        if len(out) > count:  # a bundle straddles what was asked: keep the rest for the next take
            held.extendleft(reversed(out[count:]))
            del out[count:]
        return out

    def take_ready(self, rank: int, limit: int) -> list[Any]:
        """Between 1 and ``limit`` items for ``rank``: blocks for the first, then adds what is already queued.

        This is the elastic micro-batch: big when producers are ahead, small when they are behind
        (``take_tokens``: the same, sized by tokens).
        """
        if limit <= 0:
            return []
        held, local = self._box(rank)
        if local:
            if not held:
                raise RuntimeError(f"stream {self.name!r}: rank {rank} takes from an empty local box (kept local)")
            return [held.popleft() for _ in range(min(limit, len(held)))]
        if not held:
            with get_tracer().span(f"wait {self.name}", cat="wait_channel"):
                held.extend(_unpack(self.channel.get(key=rank)))
        while len(held) < limit and self.channel.qsize(key=rank) > 0:
            held.extend(_unpack(self.channel.get(key=rank)))
        return [held.popleft() for _ in range(min(limit, len(held)))]

    def take_tokens(self, rank: int, limit: int, budget: int, weigh: Callable[[Any], int], *,
                    wait: bool = False) -> list[Any]:
        """Between 1 and ``limit`` items for ``rank`` weighing at most ``budget`` together by ``weigh``
        (a token count), the first one whatever it weighs. Blocks for the first; then adds what is
        already queued (``wait``: blocks for more until the budget or ``limit`` is reached). An item that
        would overshoot the budget stays with this consumer for its next take."""
        if limit <= 0:
            return []
        held, local = self._box(rank)
        out: list[Any] = []
        used = 0
        while len(out) < limit:
            if not held:
                if local:
                    if out:
                        break
                    raise RuntimeError(f"stream {self.name!r}: rank {rank} takes from an empty local box (kept local)")
                if out and not wait and self.channel.qsize(key=rank) == 0:
                    break
                with get_tracer().span(f"wait {self.name}", cat="wait_channel"):
                    held.extend(_unpack(self.channel.get(key=rank)))
            w = weigh(held[0])
            if out and used + w > budget:
                break
            out.append(held.popleft())
            used += w
        return out

    def close(self) -> None:
        """End the stream (consumers blocked on it get ``ChannelClosed``); local boxes are forgotten."""
        for key in [k for k in _LOCAL if k[0] == self.name]:
            del _LOCAL[key]
        self.channel.close()

    def __repr__(self) -> str:
        return f"GroupStream({self.name!r}, consumers={self.consumers})"
