"""Many items from several producer processes through one bounded channel: every item arrives exactly once.

Each of 3 producer ranks puts 300 items (every 5th large enough to travel through shared memory)
into one channel of capacity 8; consumers in other processes take them through a plain get (a
window of one item), the pushed path (a window of 32 items pushed ahead of the gets) or
``get_batch``, and the multiset of what they received must equal what was put: a host that loses
or repeats even one item in a few hundred fails here.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from m2flow.runtime import WorkerGroup
from m2flow.runtime.channel import Channel, ChannelClosed
from m2flow.runtime.worker import Worker
from tests.ray_session import shared_cluster

pytestmark = pytest.mark.timeout(600)

PRODUCERS = 3
ITEMS = 300  # per producer
LARGE = 50_000  # floats: a shared-memory item


class StressProducer(Worker):
    def produce(self, ch: Channel, n: int) -> int:
        for i in range(n):
            size = LARGE if i % 5 == 0 else 3
            ch.put({"rank": self.rank, "i": i, "x": torch.full((size,), float(i))}, weight=1 + i % 3)
        return n


def _check(item: dict) -> tuple[int, int]:
    assert torch.equal(item["x"], torch.full_like(item["x"], float(item["i"])))
    return item["rank"], item["i"]


class StressConsumer(Worker):
    def consume(self, ch: Channel, mode: str) -> list[tuple[int, int]]:
        """Everything this rank takes until the channel closes, as (producer rank, index)."""
        got = []
        if mode == "pushed":
            ch = ch.with_options(prefetch=32)
        try:
            while True:
                if mode == "get_batch":
                    batch = ch.get_batch(5)
                    got.extend(_check(item) for item in batch)
                else:
                    got.append(_check(ch.get()))
        except ChannelClosed:
            return got


@pytest.fixture(scope="module")
def groups():
    cluster = shared_cluster()
    prod = WorkerGroup(StressProducer, cluster, "stress-prod", num_ranks=PRODUCERS)
    cons = WorkerGroup(StressConsumer, cluster, "stress-cons", num_ranks=3)
    yield prod, cons
    prod.shutdown()
    cons.shutdown()


SENT = Counter((r, i) for r in range(PRODUCERS) for i in range(ITEMS))


@pytest.mark.parametrize("modes", [("get",), ("pushed",), ("get_batch",), ("get", "get"), ("pushed", "pushed"),
                                   ("get_batch", "get_batch"), ("get", "pushed", "get_batch")], ids="+".join)
def test_every_item_of_every_producer_arrives_exactly_once(groups, modes):
    prod, cons = groups
    ch = Channel.create(f"stress-{'-'.join(modes)}", maxsize=8)
    try:
        consuming = cons.execute_each("consume", [(ch, m) for m in modes], ranks=list(range(len(modes))))
        assert prod.produce(ch, ITEMS).wait(timeout=300) == [ITEMS] * PRODUCERS
        ch.close()
        received = consuming.wait(timeout=300)
        got = Counter(x for part in received for x in part)
        assert got == SENT, (f"lost {sum((SENT - got).values())}, repeated {sum((got - SENT).values())}: "
                             f"{sorted((SENT - got) + (got - SENT))[:10]}")
        # A lone consumer sees each producer's items in the order they were put. Competing ones are held to
        # the multiset only: an item recalled from one consumer's window may reach a consumer after a later one.
        for part in received if len(modes) == 1 else []:
            for r in range(PRODUCERS):
                mine = [i for q, i in part if q == r]
                assert mine == sorted(mine)
        m = ch.metrics()
        assert m.items_in == m.items_out == PRODUCERS * ITEMS and m.max_depth <= 8
    finally:
        ch.destroy()
