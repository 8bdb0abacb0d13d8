"""``ExchangeSum``: the sum over a group's ranks through the communicator, bitwise equal on every rank."""

from __future__ import annotations

import pytest
import torch

from m2flow.runtime import WorkerError, WorkerGroup
from m2flow.runtime.comm.collectives import ExchangeSum
from m2flow.runtime.worker import Worker
from m2flow.workers.config import uses_exchange
from tests.ray_session import shared_cluster


class Summer(Worker):
    def __init__(self) -> None:
        self.sum = ExchangeSum(self.comm, self.group_name, self.rank, self.world_size)

    def sums(self, shapes: list[tuple[int, ...]], dtype: str) -> list[bytes]:
        """Sum a tensor per shape, each rank's drawn from its own seed; the results' bytes."""
        out = []
        for i, shape in enumerate(shapes):
            gen = torch.Generator().manual_seed(100 * i + self.rank)
            t = (torch.randn(shape, generator=gen) * 10 ** (self.rank - 1)).to(getattr(torch, dtype))
            self.sum(t)
            out.append(t.numpy().tobytes())
        return out

    def send_and_sum(self, shape: tuple[int, ...], other_first: bool) -> None:
        if other_first and self.rank == 0:
            self.comm.send("not a sum", self.group_name, 1)
        self.sum(torch.zeros(shape))


def expected_sums(world: int, shapes: list[tuple[int, ...]], dtype: str) -> list[bytes]:
    out = []
    for i, shape in enumerate(shapes):
        terms = [(torch.randn(shape, generator=torch.Generator().manual_seed(100 * i + r)) * 10 ** (r - 1))
                 .to(getattr(torch, dtype)) for r in range(world)]
        total = terms[0] + terms[1]
        for t in terms[2:]:
            total = total + t
        out.append(total.numpy().tobytes())
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_same_sum_in_rank_order(world):
    group = WorkerGroup(Summer, shared_cluster(), f"summers{world}", num_ranks=world)
    try:
        # A large tensor goes through shared memory, a small one inline; several calls keep their order.
        shapes = [(1_000_000,), (7,), (3, 5), (250_000,)]
        for dtype in ("float32", "float64"):
            results = group.sums(shapes, dtype).wait()
            assert all(r == results[0] for r in results)  # bitwise equal replicas
            assert results[0] == expected_sums(world, shapes, dtype)  # sum of the terms in rank order
    finally:
        group.shutdown()


def test_mismatched_shapes_or_a_foreign_message_fail_loudly():
    group = WorkerGroup(Summer, shared_cluster(), "summers-bad", num_ranks=2)
    try:
        with pytest.raises(WorkerError, match=r"sent torch.float32\(\d,\), rank \d has torch.float32\(\d,\)"):
            group.execute_each("send_and_sum", [((3,), False), ((4,), False)]).wait()
    finally:
        group.shutdown()
    group = WorkerGroup(Summer, shared_cluster(), "summers-foreign", num_ranks=2)
    try:
        with pytest.raises(WorkerError, match="rank 0 sent something else"):
            group.execute_each("send_and_sum", [((3,), True), ((3,), True)]).wait()
    finally:
        group.shutdown()


def test_host_sum_setting_picks_the_exchange_for_a_few_cpu_ranks():
    assert uses_exchange("auto", 2, "cpu") and uses_exchange("auto", 4, "cpu")
    assert not uses_exchange("auto", 5, "cpu") and uses_exchange("comm", 8, "cpu")
    assert not uses_exchange("auto", 1, "cpu") and not uses_exchange("gloo", 2, "cpu")
    assert not uses_exchange("comm", 2, "cuda")  # GPU ranks sum with the device backend
    with pytest.raises(ValueError, match="host_sum must be"):
        uses_exchange("nccl", 2, "cpu")
