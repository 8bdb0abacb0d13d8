"""Channels between worker groups on the shared local Ray: tensors, several ranks, dead producers."""

from __future__ import annotations

import os
import time

import pytest
import torch

from m2flow.runtime import WorkerError, WorkerGroup
from m2flow.runtime.channel import Channel, ChannelClosed
from m2flow.runtime.comm import PeerDiedError
from m2flow.runtime.worker import Worker
from tests.ray_session import shared_cluster
from tests.processes import process_gone


class Producer(Worker):
    def produce(self, ch: Channel, n: int) -> int:
        for i in range(n):
            # every third item is large enough to travel through shared memory
            size = 200_000 if i % 3 == 0 else 4
            ch.put({"rank": self.rank, "i": i, "x": torch.full((size,), float(i))}, key=i % 2)
        return n

    def produce_then_die(self, ch: Channel) -> None:
        ch.put("last item")
        os._exit(1)


class Consumer(Worker):
    def consume(self, ch: Channel, key: int) -> list[tuple[int, int]]:
        got = []
        try:
            while True:
                item = ch.get(key=key)
                assert torch.equal(item["x"], torch.full_like(item["x"], float(item["i"])))
                got.append((item["rank"], item["i"]))
        except ChannelClosed:
            return got

    def drain_after_death(self, ch: Channel) -> str:
        first = ch.get(timeout=60)
        try:
            ch.get(timeout=60)
        except PeerDiedError as exc:
            return f"{first} | {exc}"
        return "no error"


@pytest.fixture(scope="module")
def groups():
    cluster = shared_cluster()
    prod = WorkerGroup(Producer, cluster, "ch-prod", num_ranks=2)
    cons = WorkerGroup(Consumer, cluster, "ch-cons", num_ranks=2)
    yield prod, cons
    prod.shutdown()
    cons.shutdown()


def test_two_producer_ranks_feed_two_keyed_consumers_through_a_bounded_channel(groups):
    prod, cons = groups
    ch = Channel.create("ch-workers", maxsize=4)
    try:
        consuming = cons.execute_each("consume", [(ch, 0), (ch, 1)])
        assert prod.produce(ch, 30).wait(timeout=120) == [30, 30]
        ch.close()
        by_key = consuming.wait(timeout=120)
        assert sorted(by_key[0]) == sorted((r, i) for r in range(2) for i in range(0, 30, 2))
        assert sorted(by_key[1]) == sorted((r, i) for r in range(2) for i in range(1, 30, 2))
        for got in by_key:  # each producer's items arrive in its order
            for r in range(2):
                mine = [i for q, i in got if q == r]
                assert mine == sorted(mine)
        assert ch.metrics().max_depth <= 4
    finally:
        ch.destroy()


def test_consumer_of_a_dead_producer_gets_an_error_naming_it(groups):
    _, cons = groups
    prod = WorkerGroup(Producer, shared_cluster(), "ch-dying", num_ranks=1)
    ch = Channel.create("ch-dying")
    try:
        draining = cons.drain_after_death(ch, ranks=[0])
        dying = prod.produce_then_die(ch)
        (message,) = draining.wait(timeout=120)
        assert message.startswith("last item | ")
        assert "ch-dying:0" in message and "died" in message
        with pytest.raises(WorkerError):
            dying.wait(timeout=30)
    finally:
        prod.shutdown()
        ch.destroy()


def test_the_channels_of_one_process_share_a_host_process_that_ends_with_the_last():
    import ray

    shared_cluster()
    a, b = Channel.create("shared-a"), Channel.create("shared-b", maxsize=2)
    try:
        assert a.address.actor_name == b.address.actor_name and a.address.host_key != b.address.host_key
        pid = ray.get(ray.get_actor(a.address.actor_name).pid.remote())
        a.put("a0")
        b.put("b0")
        assert (a.get(), b.get()) == ("a0", "b0")
        a.disconnect()
        a.destroy()  # one channel released: the other's host serves on in the same process
        b.put("b1")
        assert b.get() == "b1" and not process_gone(pid, within=0.5)
    finally:
        b.disconnect()
        b.destroy()
    assert process_gone(pid, within=30.0)  # the last channel took the process with it
    c = Channel.create("shared-c")  # a fresh process for the next channels
    try:
        assert c.address.actor_name != a.address.actor_name
        c.put(1)
        assert c.get() == 1
    finally:
        c.disconnect()
        c.destroy()
