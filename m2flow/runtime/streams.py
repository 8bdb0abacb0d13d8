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

With ``lanes`` L > 1 (bounded staleness: up to L iterations in flight at once) each consumer rank
has L sub-queues and an item goes to lane ``step % L``: a consumer taking iteration k's items never
gets a faster producer rank's items of iteration k + 1. Iteration k + L starts only after iteration
k has been consumed, so L lanes are enough.
"""

from __future__ import annotations

import logging
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


log = logging.getLogger(__name__)

TEARDOWN_CLOSE_S = 5.0
"""Seconds a teardown waits for a channel host to confirm the close (``GroupStream.abort``)."""

_LOCAL: dict[tuple[str, int], deque[Any]] = {}
"""(stream name, consumer rank) -> the items put for that rank in this process and not yet taken."""


class GroupStream:
    """Put routed items in; consumer ``rank`` takes its own, all at once or as they become ready."""

    def __init__(self, channel: Channel, consumers: int, lanes: int = 1) -> None:
        if consumers < 1:
            raise ValueError(f"a stream needs at least one consumer rank, got {consumers}")
        if lanes < 1:
            raise ValueError(f"a stream needs at least one lane, got {lanes}")
        self.channel = channel
        self.consumers = consumers
        self.lanes = lanes
        self._held: dict[Any, deque[Any]] = defaultdict(deque)  # unpacked, not yet taken (this process)

    def __getstate__(self) -> dict[str, Any]:
        # Held items belong to the process that unpacked them; a copy sent elsewhere starts empty.
        return {"channel": self.channel, "consumers": self.consumers, "lanes": self.lanes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["channel"], state["consumers"], state.get("lanes", 1))  # type: ignore[misc]

    @classmethod
    def create(cls, name: str, consumers: int, lanes: int = 1) -> GroupStream:
        """A stream over a new channel called ``name`` (unbounded: an iteration's data always fits)."""
        return cls(Channel.create(name), consumers, lanes)

    @property
    def name(self) -> str:
        return self.channel.name

    def key(self, slot: int) -> int:
        """The consumer rank of ``slot``."""
        return slot % self.consumers

    def _queue(self, rank: int, step: int | None) -> Any:
        """The channel key of ``rank``'s items of iteration ``step`` (its rank alone with one lane)."""
        if self.lanes == 1:
            return rank
        if step is None:
            raise ValueError(f"stream {self.name!r} has {self.lanes} lanes: a take names the iteration")
        return (rank, step % self.lanes)

    def expected(self, rank: int, num_slots: int) -> int:
        """How many of an iteration's ``num_slots`` items go to consumer ``rank``."""
        return len(range(rank, num_slots, self.consumers))

    def keep_local(self, rank: int) -> None:
        """Keep the items for consumer ``rank`` in this process: it produces all of them itself, and
        takes them only after putting them (a take that finds too few then raises, as nothing else
        could bring the rest)."""
        if self.lanes != 1:
            raise ValueError(f"stream {self.name!r}: items kept local need a single lane")
        _LOCAL.setdefault((self.name, rank), self._held[rank])

    def _box(self, rank: int, key: Any) -> tuple[deque[Any], bool]:
        """The items of ``rank`` (channel key ``key``) held in this process, and whether that is all it
        will ever get."""
        local = _LOCAL.get((self.name, rank))
        return (local, True) if local is not None else (self._held[key], False)

    def put(self, item: _Routed) -> None:
        """Send ``item`` to the consumer rank of its slot."""
        self.put_many([item])

    def put_many(self, items: Iterable[_Routed]) -> None:
        """Send ``items``, one message per consumer rank (in slot order within each)."""
        by_key: dict[Any, list[Any]] = defaultdict(list)
        for item in items:
            rank = self.key(item.slot)
            by_key[(rank, self._queue(rank, getattr(item, "step", None)))].append(item)
        for (rank, key), mine in by_key.items():
            local = _LOCAL.get((self.name, rank))
            if local is not None:
                local.extend(mine)
            elif len(mine) == 1:
                self.channel.put(mine[0], weight=1, key=key)
            else:
                self.channel.put(_Bundle(mine), weight=len(mine), key=key)

    def take(self, rank: int, count: int, step: int | None = None) -> list[Any]:
        """Exactly ``count`` items for ``rank`` (of iteration ``step``, with several lanes), blocking
        until they are all there."""
        if count <= 0:
            return []
        key = self._queue(rank, step)
        held, local = self._box(rank, key)
        if local and len(held) < count:
            raise RuntimeError(f"stream {self.name!r}: rank {rank} takes {count} items, but only {len(held)} "
                               "were put in this process (kept local)")
        out = [held.popleft() for _ in range(min(count, len(held)))]
        if len(out) < count:
            with get_tracer().span(f"wait {self.name}", cat="wait_channel", items=count):
                # A batch stops short of the target when the next bundle would overshoot it; the next
                # request then gets that bundle whole (an item heavier than the target comes alone).
                while len(out) < count:
                    got = self.channel.get_batch(count - len(out), key=key)
                    if not got:
                        raise RuntimeError(f"stream {self.name!r} ended with {len(out)} of {count} items for rank {rank}")
                    for item in got:
                        out.extend(_unpack(item))
        if len(out) > count:  # a bundle straddles what was asked: keep the rest for the next take
            held.extendleft(reversed(out[count:]))
            del out[count:]
        return out

    def take_ready(self, rank: int, limit: int, step: int | None = None) -> list[Any]:
        """Between 1 and ``limit`` items for ``rank`` (of iteration ``step``, with several lanes): blocks
        for the first, then adds what is already queued.

        This is the elastic micro-batch: big when producers are ahead, small when they are behind
        (``take_tokens``: the same, sized by tokens).
        """
        if limit <= 0:
            return []
        key = self._queue(rank, step)
        held, local = self._box(rank, key)
        if local:
            if not held:
                raise RuntimeError(f"stream {self.name!r}: rank {rank} takes from an empty local box (kept local)")
            return [held.popleft() for _ in range(min(limit, len(held)))]
        if not held:
            with get_tracer().span(f"wait {self.name}", cat="wait_channel"):
                held.extend(_unpack(self.channel.get(key=key)))
        while len(held) < limit and self.channel.qsize(key=key) > 0:
            held.extend(_unpack(self.channel.get(key=key)))
        return [held.popleft() for _ in range(min(limit, len(held)))]

    def take_tokens(self, rank: int, limit: int, budget: int, weigh: Callable[[Any], int], *,
                    wait: bool = False, step: int | None = None) -> list[Any]:
        """Between 1 and ``limit`` items for ``rank`` weighing at most ``budget`` together by ``weigh``
        (a token count), the first one whatever it weighs. Blocks for the first; then adds what is
        already queued (``wait``: blocks for more until the budget or ``limit`` is reached). An item that
        would overshoot the budget stays with this consumer for its next take. ``step`` names the
        iteration, as for ``take_ready``."""
        if limit <= 0:
            return []
        key = self._queue(rank, step)
        held, local = self._box(rank, key)
        out: list[Any] = []
        used = 0
        while len(out) < limit:
            if not held:
                if local:
                    if out:
                        break
                    raise RuntimeError(f"stream {self.name!r}: rank {rank} takes from an empty local box (kept local)")
                if out and not wait and self.channel.qsize(key=key) == 0:
                    break
                with get_tracer().span(f"wait {self.name}", cat="wait_channel"):
                    held.extend(_unpack(self.channel.get(key=key)))
            w = weigh(held[0])
            if out and used + w > budget:
                break
            out.append(held.popleft())
            used += w
        return out

    def close(self, sync: bool = True, timeout: float = 60.0) -> None:
        """End the stream (consumers blocked on it get ``ChannelClosed``); local boxes are forgotten.
        ``sync``, ``timeout``: as for ``Channel.close`` (a teardown passes ``sync=False``)."""
        self._forget_local()
        self.channel.close(sync=sync, timeout=timeout)

    def abort(self) -> None:
        """End the stream at once, for a teardown: no wait for the puts still in flight (nothing will take
        them), nor for a consumer that cannot answer; a host that does not answer within a few seconds is
        left to ``destroy``. Never raises."""
        try:
            self.close(sync=False, timeout=TEARDOWN_CLOSE_S)
        except Exception:  # noqa: BLE001 - the host may be gone already, or busy: destroy() ends it anyway
            log.debug("stream %s: closing it for a teardown failed", self.name, exc_info=True)

    def destroy(self) -> None:
        """Release the stream for good: this process's connection, then the channel's host (its
        listener and serving threads; the shared host actor too once it hosts no other channel of this
        process). Call it once every user is done."""
        self._forget_local()
        self.channel.disconnect()
        self.channel.destroy()

    def _forget_local(self) -> None:
        for key in [k for k in _LOCAL if k[0] == self.name]:
            del _LOCAL[key]

    def __repr__(self) -> str:
        lanes = f", lanes={self.lanes}" if self.lanes != 1 else ""
        return f"GroupStream({self.name!r}, consumers={self.consumers}{lanes})"
