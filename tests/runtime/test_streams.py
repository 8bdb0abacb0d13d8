"""A workflow edge over a real channel: routing by slot, per-rank counts, whole and elastic takes."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import dataclass

import pytest

from m2flow.runtime.streams import GroupStream


@dataclass
class Item:
    step: int
    slot: int


@pytest.fixture
def stream():
    s = GroupStream.create(f"test-stream-{uuid.uuid4().hex[:8]}", consumers=3)
    yield s
    s.close()


def test_items_go_to_rank_slot_modulo_consumers_and_counts_are_known(stream):
    assert [stream.expected(r, 7) for r in range(3)] == [3, 2, 2]
    for slot in range(7):
        stream.put(Item(0, slot))
    assert [i.slot for i in stream.take(0, 3)] == [0, 3, 6]
    assert [i.slot for i in stream.take(2, 2)] == [2, 5]
    assert [i.slot for i in stream.take(1, 2)] == [1, 4]
    assert stream.take(1, 0) == []


def test_take_ready_returns_what_is_queued_up_to_the_limit(stream):
    for slot in (0, 3, 6, 9):
        stream.put(Item(1, slot))
    first = stream.take_ready(0, 3)
    assert [i.slot for i in first] == [0, 3, 6]
    assert [i.slot for i in stream.take_ready(0, 3)] == [9]


def test_a_stream_needs_a_consumer():
    with pytest.raises(ValueError, match="at least one consumer"):
        GroupStream(None, 0)  # type: ignore[arg-type]


def test_put_many_bundles_per_rank_and_takes_of_any_size_get_every_item_once(stream):
    # 12 items of one iteration, sent in uneven bundles: rank 0 gets slots 0, 3, 6, 9.
    stream.put_many([Item(0, s) for s in range(5)])      # rank 0: [0, 3]
    stream.put_many([Item(0, s) for s in range(5, 8)])   # rank 0: [6]
    stream.put_many([Item(0, s) for s in range(8, 12)])  # rank 0: [9]
    assert stream.channel.qsize(key=0) == 3              # one channel item per put_many and rank
    # Takes that cut bundles: 1, then 2 (the rest of [0, 3] plus [6]), then 1.
    got = [stream.take(0, 1), stream.take(0, 2), stream.take(0, 1)]
    assert [[i.slot for i in part] for part in got] == [[0], [3, 6], [9]]
    assert [i.slot for i in stream.take_ready(1, 2)] == [1, 4]
    assert [i.slot for i in stream.take_ready(1, 5)] == [7, 10]
    assert [i.slot for i in stream.take(2, 4)] == [2, 5, 8, 11]
    assert all(stream.channel.qsize(key=r) == 0 for r in range(3))


def test_a_take_ready_limit_below_a_bundle_keeps_the_rest_for_the_next_take(stream):
    stream.put_many([Item(0, s) for s in (0, 3, 6, 9, 12)])
    assert [i.slot for i in stream.take_ready(0, 2)] == [0, 3]
    stream.put(Item(0, 15))
    assert [i.slot for i in stream.take_ready(0, 2)] == [6, 9]
    assert [i.slot for i in stream.take(0, 2)] == [12, 15]


def test_a_copy_of_a_stream_starts_without_the_items_another_process_holds(stream):
    import pickle

    stream.put_many([Item(0, s) for s in (0, 3)])
    assert [i.slot for i in stream.take_ready(0, 1)] == [0]
    copy = pickle.loads(pickle.dumps(stream))
    assert copy.consumers == 3 and copy.name == stream.name and not copy._held[0]
    assert [i.slot for i in stream.take(0, 1)] == [3]


def test_a_rank_kept_local_gets_its_items_without_the_channel(stream):
    # Consumer rank 1 lives in the producing process: its items stay here, the others travel.
    stream.keep_local(1)
    stream.put_many([Item(0, slot) for slot in range(6)])
    assert stream.channel.qsize(key=1) == 0 and stream.channel.qsize(key=0) == 1  # one bundle for rank 0
    assert [i.slot for i in stream.take(1, 1)] == [1]
    assert [i.slot for i in stream.take_ready(1, 5)] == [4]
    assert [i.slot for i in stream.take(0, 2)] == [0, 3]
    # Nothing else can bring a local rank's items: a take that finds too few fails instead of waiting.
    with pytest.raises(RuntimeError, match="only 0 were put in this process"):
        stream.take(1, 1)
    with pytest.raises(RuntimeError, match="empty local box"):
        stream.take_ready(1, 1)
    # Another copy of the stream in this process shares the local box.
    copy = pickle.loads(pickle.dumps(stream))
    copy.put(Item(1, 7))
    assert [i.slot for i in stream.take(1, 1)] == [7]


def test_take_tokens_fills_a_budget_keeps_the_overshooting_item_and_loses_none(stream):
    weight = {s: (s % 4 + 1) * 10 for s in range(0, 300, 3)}  # rank 0's 100 items weigh 10..40 tokens
    stream.put_many([Item(0, s) for s in range(150)])
    stream.put_many([Item(0, s) for s in range(150, 300)])
    taken: list[list[int]] = []
    remaining = 100
    while remaining:
        part = stream.take_tokens(0, remaining, 60, lambda i: weight[i.slot])
        taken.append([i.slot for i in part])
        remaining -= len(part)
    assert [s for part in taken for s in part] == sorted(weight)  # every item once, in order
    for part in taken:
        total = sum(weight[s] for s in part)
        assert total <= 60 or len(part) == 1
        assert len(part) >= 1
    # Full: each take stopped because the next item would not fit.
    flat = [s for part in taken for s in part]
    cut = 0
    for part in taken[:-1]:
        cut += len(part)
        assert sum(weight[s] for s in part) + weight[flat[cut]] > 60


def test_take_tokens_returns_what_is_queued_without_waiting_for_the_budget(stream):
    stream.put(Item(0, 0))
    stream.put(Item(0, 3))
    assert [i.slot for i in stream.take_tokens(0, 5, 1000, lambda i: 1)] == [0, 3]  # does not block for more
