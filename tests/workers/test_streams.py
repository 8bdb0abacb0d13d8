"""A workflow edge over a real channel: routing by slot, per-rank counts, whole and elastic takes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from m2flow.workers.streams import GroupStream


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
