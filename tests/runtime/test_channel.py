"""Channels in one process (host in threads here, clients over its sockets): semantics and races."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m2flow.runtime.channel import Channel, ChannelClosed
from m2flow.runtime.channel.connection import _Connection
from m2flow.runtime.comm import CommTimeout

_names = itertools.count()


@pytest.fixture
def make_channel():
    made: list[Channel] = []

    def make(maxsize: int = 0) -> Channel:
        ch = Channel.create(f"test-{next(_names)}", maxsize, local=True)
        made.append(ch)
        return ch

    yield make
    for ch in made:
        ch.disconnect()
        ch.destroy()


def test_fifo_per_key_and_sizes(make_channel):
    ch = make_channel(maxsize=10)
    for i in range(3):
        ch.put(i)
    ch.put({"t": torch.arange(4)}, key="b")
    assert (ch.qsize(), ch.qsize("b"), ch.total_size()) == (3, 1, 4)
    assert not ch.empty() and ch.empty("nothing") and not ch.full()
    assert sorted(ch.keys(), key=str) == [None, "b"]
    assert [ch.get() for _ in range(3)] == [0, 1, 2]
    assert torch.equal(ch.get(key="b")["t"], torch.arange(4))
    assert ch.total_size() == 0


def test_get_batch_stops_before_exceeding_the_target_weight(make_channel):
    ch = make_channel()
    for name, w in [("a", 3), ("b", 2), ("c", 4), ("d", 1), ("heavy", 10), ("e", 1)]:
        ch.put(name, weight=w)
    assert ch.get_batch(5) == ["a", "b"]  # 3 + 2 = 5
    assert ch.get_batch(6) == ["c", "d"]  # 4 + 1, and the heavy item would exceed 6
    assert ch.get_batch(5) == ["heavy"]  # heavier than the target: it comes alone
    ch.put("f", weight=1)
    assert ch.get_batch(2) == ["e", "f"]


def test_get_batch_waits_until_the_target_is_reached(make_channel):
    ch = make_channel()
    ch.put("a", weight=1)
    work = ch.get_batch(3, async_op=True)
    ch.total_size()  # a reply on the same connection: the host has seen the request by now
    assert not work.done()  # still waiting: only weight 1 of 3 is there
    ch.put("b", weight=2)
    assert work.wait(timeout=30) == ["a", "b"]


def test_bounded_put_blocks_while_full_and_resumes_after_a_get(make_channel):
    ch = make_channel(maxsize=2)
    ch.put("a")
    ch.put("b")
    assert ch.full()
    blocked = ch.put("c", async_op=True)
    assert ch.total_size() == 2  # the blocked item did not slip in
    assert not blocked.done()
    assert ch.get() == "a"
    blocked.wait(timeout=30)
    assert [ch.get(), ch.get()] == ["b", "c"]
    assert ch.metrics().put_wait.count >= 1


def test_close_wakes_waiting_consumers_after_draining(make_channel):
    ch = make_channel()
    ch.put(1)
    ch.put(2)
    waiting = []
    outcomes: list[object] = []

    def consume() -> None:
        waiting.append(True)
        try:
            outcomes.append(list(ch))  # iteration ends at close
            ch.get()
        except ChannelClosed as exc:
            outcomes.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    blocked = ch.get(async_op=True)  # this one waits: the thread takes 1 and 2 or we do
    ch.close()
    t.join(timeout=30)
    assert not t.is_alive()
    got = outcomes[0]
    try:
        mine = [blocked.wait(timeout=30)]
    except ChannelClosed:
        mine = []
    assert sorted(got + mine) == [1, 2]
    assert isinstance(outcomes[1], ChannelClosed)
    with pytest.raises(ChannelClosed):
        ch.put(3)


def test_timed_out_get_loses_nothing(make_channel):
    ch = make_channel()
    with pytest.raises(CommTimeout):
        ch.get(timeout=0.2)
    ch.put("kept")
    assert ch.get(timeout=30) == "kept"


def test_prefetched_items_are_served_in_order_and_given_back(make_channel):
    ch = make_channel()
    for i in range(5):
        ch.put(i)
    fast = ch.with_options(prefetch=4)
    assert fast.get() == 0  # 1, 2, 3 were pushed along
    assert ch.total_size() == 4  # pushed but untaken items are still in the channel
    assert fast.get() == 1
    fast.disconnect()  # 2 and 3 go back to the front
    assert [ch.get() for _ in range(3)] == [2, 3, 4]


class _OtherProcess:
    """A second connection to the host, standing in for a consumer in another process."""

    def __init__(self, ch: Channel, prefetch: int = 1, other_node: bool = False) -> None:
        # On "another node" it reaches the host over TCP, and tensor bytes travel in the stream.
        self.conn = _Connection(replace(ch.address, node_id="another-node") if other_node else ch.address)
        self.prefetch = prefetch

    def get(self, key=None, timeout: float = 30) -> object:
        item, fut = self.conn.take(key, self.prefetch)
        return item if fut is None else self.conn.decode(fut.result(timeout=timeout))

    def die(self) -> None:
        self.conn.conn.close()  # no goodbye: the host just sees the socket end


def test_items_pushed_ahead_go_to_another_consumer_when_their_holder_leaves_or_dies(make_channel):
    ch = make_channel()
    for i in range(8):
        ch.put(i)
    leaving, dying = _OtherProcess(ch, prefetch=3), _OtherProcess(ch, prefetch=3)
    first, second = leaving.get(), dying.get()  # each had up to 3 more pushed along
    assert first == 0
    # 8 put, 2 taken, held ones still counted (the other process may not have reported its take yet)
    assert dying.conn.request(("stat", "total", None))[1].result(timeout=30) in (6, 7)
    leaving.conn.close()
    dying.die()
    rest = [ch.get(timeout=30) for _ in range(6)]
    assert sorted([first, second, *rest]) == list(range(8))  # nothing lost, nothing twice
    assert ch.total_size() == 0


def test_a_blocked_consumer_recalls_what_another_holds(make_channel):
    ch = make_channel()
    for i in range(3):
        ch.put(i)
    hoarder = _OtherProcess(ch, prefetch=3)
    assert hoarder.get() == 0  # 1 and 2 were pushed along, and it does not come back for them
    assert ch.get(timeout=30) == 1  # so they are handed back to the consumer that waits
    assert hoarder.get() == 2  # whoever holds 2 now gives it back in turn
    ch.put(3)
    assert ch.get(timeout=30) == 3
    hoarder.conn.close()


def test_close_ends_consumers_after_a_recall_of_partly_taken_items(make_channel):
    ch = make_channel()
    for i in range(8):
        ch.put(i)
    hoarder = _OtherProcess(ch, prefetch=8)
    # 1..7 were pushed along; taking 1 and 2 reports nothing yet (takes are reported in runs)
    assert [hoarder.get() for _ in range(3)] == [0, 1, 2]
    assert ch.get(timeout=30) == 3  # recalls 3..7 from the hoarder, which still owes 1 and 2
    ch.close()
    assert [ch.get(timeout=30) for _ in range(4)] == [4, 5, 6, 7]
    # Both consumers are told the stream ended: what the hoarder took counts as taken.
    with pytest.raises(ChannelClosed):
        hoarder.get(timeout=30)
    with pytest.raises(ChannelClosed):
        ch.get(timeout=30)
    hoarder.conn.close()


def _tensor_item(i: int) -> dict:
    return {"i": i, "x": torch.full((100_000,), float(i))}  # large enough for shared memory


def _three_held_by_another_node(ch: Channel) -> _OtherProcess:
    """Put items 0..3; a consumer on another node takes 0 and holds 1..3, pushed to it as bytes."""
    for i in range(4):
        ch.put(_tensor_item(i))
    remote = _OtherProcess(ch, prefetch=4, other_node=True)
    assert remote.get()["i"] == 0
    return remote


def test_items_pushed_to_another_node_and_given_back_keep_their_memory(make_channel):
    ch = make_channel()
    remote = _three_held_by_another_node(ch)
    # A consumer beside the host recalls them: they reach it through the shared memory again.
    for i in (1, 2, 3):
        item = ch.get(timeout=30)
        assert item["i"] == i and torch.equal(item["x"], torch.full((100_000,), float(i)))
    assert ch.total_size() == 0
    remote.conn.close()


def test_a_producer_does_not_reuse_memory_of_items_still_held_for_another_node(make_channel):
    ch = make_channel()
    remote = _three_held_by_another_node(ch)  # the host copied 1..3 out of their segments
    time.sleep(0.5)  # the pushes are written, the host's copies dropped
    for i in range(4, 8):  # the producer's pool must not hand out the segments of 1..3 again
        ch.put(_tensor_item(i))
    seen = []
    for _ in range(1, 8):  # what the other node holds is recalled once the queue runs dry
        item = ch.get(timeout=30)
        assert torch.equal(item["x"], torch.full((100_000,), float(item["i"]))), item["i"]
        seen.append(item["i"])
    assert sorted(seen) == list(range(1, 8))
    assert ch.total_size() == 0
    remote.conn.close()


def test_held_items_occupy_capacity_until_taken(make_channel):
    ch = make_channel(maxsize=4)
    for i in range(4):
        ch.put(i)
    fast = ch.with_options(prefetch=4)
    assert fast.get() == 0  # 1, 2, 3 held by this process
    ch.put(4)
    assert ch.full()
    blocked = ch.put(5, async_op=True)
    ch.total_size()  # a reply on the same connection: the host has seen the put's credit request
    assert not blocked.done()
    assert [fast.get() for _ in range(5)] == [1, 2, 3, 4, 5]
    blocked.wait(timeout=30)
    assert ch.total_size() == 0


def test_async_forms(make_channel):
    ch = make_channel()

    async def run() -> list[int]:
        await ch.put(1, async_op=True)
        await ch.put(2, async_op=True)
        first = await ch.get(async_op=True)
        ch.close()
        return [first] + [x async for x in ch]

    assert asyncio.run(run()) == [1, 2]


def test_metrics_record_depth_and_counts(make_channel):
    ch = make_channel()
    for i in range(3):
        ch.put(torch.zeros(4), weight=1)
    ch.get_batch(2)
    m = ch.metrics()
    assert (m.items_in, m.items_out, m.max_depth, m.bytes_in) == (3, 2, 3, 48)
    assert m.depth[-1][1] == 1
    assert m.summary()[f"channel/{ch.name}/items_out"] == 2


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    per_producer=st.lists(st.integers(0, 25), min_size=1, max_size=3),
    consumers=st.lists(st.sampled_from(["get", "batch", "prefetch"]), min_size=1, max_size=3),
    maxsize=st.integers(0, 4),
)
def test_many_producers_and_consumers_lose_and_duplicate_nothing(make_channel, per_producer, consumers, maxsize):
    ch = make_channel(maxsize)
    received: list[list[tuple[int, int]]] = [[] for _ in consumers]

    def produce(p: int, n: int) -> None:
        for i in range(n):
            ch.put((p, i), weight=1 + (i % 2))

    def consume(c: int, mode: str) -> None:
        handle = ch.with_options(prefetch=3) if mode == "prefetch" else ch
        try:
            while True:
                if mode == "batch":
                    received[c].extend(handle.get_batch(3))
                else:
                    received[c].append(handle.get())
        except ChannelClosed:
            pass

    cons = [threading.Thread(target=consume, args=(c, m)) for c, m in enumerate(consumers)]
    prods = [threading.Thread(target=produce, args=(p, n)) for p, n in enumerate(per_producer)]
    for t in cons + prods:
        t.start()
    for t in prods:
        t.join(timeout=60)
    ch.close()
    for t in cons:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in cons + prods)
    everything = sorted(x for got in received for x in got)
    assert everything == sorted((p, i) for p, n in enumerate(per_producer) for i in range(n))
    for got in received:  # each consumer saw each producer's items in order
        for p in range(len(per_producer)):
            mine = [i for q, i in got if q == p]
            assert mine == sorted(mine)


def test_a_channel_host_process_never_imports_torch():
    """A host moves bytes only: each channel's host process starts without torch's seconds of import, and a
    tensor still crosses a channel once the sender has torch (see ``comm/serialization.py``)."""
    import subprocess
    import sys

    code = ("import sys, m2flow.runtime.channel.actor, m2flow.runtime.channel.host, m2flow.runtime.comm; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
