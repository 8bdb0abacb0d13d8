"""Payload encoding and placement: every payload kind survives inline and shared-memory placement."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from m2flow.runtime.comm.payload import Desc, pack, unpack
from m2flow.runtime.comm.serialization import encode
from m2flow.runtime.comm.shm import HEADER, SegmentCache, SegmentPool


@dataclass
class Rollout:
    """A message type holding tensors, as workers exchange them."""

    tokens: torch.Tensor
    rewards: torch.Tensor
    info: dict = field(default_factory=dict)


def payloads() -> dict[str, object]:
    """One example of every payload kind the communication layer promises to carry."""
    g = torch.Generator().manual_seed(0)
    return {
        "float_tensor": torch.randn(64, 33, generator=g),
        "bf16_tensor": torch.randn(17, generator=g).to(torch.bfloat16),
        "int_bool_complex": [torch.arange(10), torch.tensor([True, False]), torch.randn(3, dtype=torch.complex64, generator=g)],
        "strided_view": torch.randn(8, 6, generator=g).t()[1:, ::2],
        "scalar_and_empty": (torch.tensor(3.5), torch.empty(0, 4)),
        "grad_parameter": torch.nn.Parameter(torch.ones(3)),
        "nested_dict": {"a": {"b": [torch.full((2, 2), 7.0), 1, "x"]}, "c": torch.zeros(5, dtype=torch.int8)},
        "dataclass": Rollout(torch.arange(12).reshape(3, 4), torch.tensor([0.5, 1.0, -1.0]), {"step": 3}),
        "numpy": {"obs": np.arange(20, dtype=np.float32).reshape(4, 5)},
        "plain": {"name": "gsm8k", "ids": list(range(50)), "ratio": 0.25, "none": None},
        "large_tensor": torch.arange(300_000, dtype=torch.float32),  # above the shared-memory threshold
    }


def assert_same(a: object, b: object) -> None:
    """Deep equality with tensors compared bit for bit, dtype, shape and requires_grad included."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, Rollout):
        assert_same(a.__dict__, b.__dict__)
    else:
        assert a == b


def _roundtrip(obj: object, pool: SegmentPool | None, cache: SegmentCache) -> object:
    packed = pack(encode(obj), pool, shm_min_bytes=0 if pool is not None else 1 << 62)
    fds = [os.dup(fd) for fd in packed.fds]  # what SCM_RIGHTS hands the receiver
    inline = [np.frombuffer(bytes(b), dtype=np.uint8).copy() for b in packed.inline]
    return unpack(Desc.from_wire(packed.desc.to_wire()), inline, fds, cache)


@pytest.mark.parametrize("placement", ["inline", "shm"])
@pytest.mark.parametrize("name", sorted(payloads()))
def test_every_payload_kind_roundtrips(name, placement):
    pool = SegmentPool("sender") if placement == "shm" else None
    obj = payloads()[name]
    assert_same(obj, _roundtrip(obj, pool, SegmentCache()))


def test_the_same_tensor_twice_arrives_as_one_object():
    t = torch.ones(4)
    out = _roundtrip([t, t, {"again": t}], SegmentPool("s"), SegmentCache())
    assert out[0] is out[1] is out[2]["again"]


def test_received_shm_tensors_view_the_segment_and_release_it_when_dropped():
    pool, cache = SegmentPool("s"), SegmentCache()
    first = _roundtrip({"x": torch.arange(1000.0), "y": torch.ones(10)}, pool, cache)
    (seg,) = pool._pooled
    assert seg.flags[0] == 1  # the receiver still holds the tensors
    second = _roundtrip(torch.zeros(1000), pool, cache)
    assert len(pool._pooled) == 2  # a busy segment is not reused
    x = first["x"]
    del first
    gc.collect()
    assert seg.flags[0] == 1  # one tensor of the message is still alive
    del x
    gc.collect()
    assert seg.flags[0] == 0
    _roundtrip(torch.zeros(1000), pool, cache)
    assert len(pool._pooled) == 2  # the freed segment was reused
    del second


def test_received_tensors_are_writable_and_private_to_the_receiver():
    pool, cache = SegmentPool("s"), SegmentCache()
    src = torch.arange(100_000.0)
    out = _roundtrip(src, pool, cache)
    out += 1
    assert torch.equal(src, torch.arange(100_000.0))
    assert out[5].item() == 6.0


def test_pool_makes_one_off_segments_past_its_cap_and_frees_them():
    pool = SegmentPool("s", max_pooled_bytes=2 << 20)
    a = pool.acquire(1 << 20)  # 1 MiB + header: a 2 MiB segment fills the pool
    b = pool.acquire(1 << 20)
    assert not a.ref.ephemeral and b.ref.ephemeral
    b.flags[0] = 0
    pool.acquire(10)  # reaps the freed one-off segment
    assert b.fd == -1 and pool._ephemeral[0] is not b


def test_broadcast_slots_release_independently():
    pool, cache = SegmentPool("s"), SegmentCache()
    packed = pack(encode(torch.ones(100_000)), pool, nslots=2, shm_min_bytes=0)
    seg = packed.segment
    got = [unpack(packed.desc.for_slot(i), [], [os.dup(seg.fd)], cache) for i in range(2)]
    assert seg.flags[:2].tolist() == [1, 1]
    del got[0]
    gc.collect()
    assert seg.flags[:2].tolist() == [0, 1] and not seg.is_free()
    del got
    gc.collect()
    assert seg.is_free()
    assert seg.capacity >= HEADER + 400_000
