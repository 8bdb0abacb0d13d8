"""Communication and channels across nodes: a two-node Ray cluster on this machine.

Ranks on different Ray nodes use TCP (the nodes could be different machines), ranks on one node
use shared memory; a channel host forwards segments to same-node consumers and copies bytes into
the stream for consumers on the other node.
"""

from __future__ import annotations

import threading

import pytest
import torch
from ray.cluster_utils import Cluster as RayTestCluster

from m2flow.runtime import Cluster, ClusterConfig, WorkerGroup
from m2flow.runtime.channel import Channel, ChannelClosed
from m2flow.runtime.comm import recv_weights, send_weights
from m2flow.runtime.worker import Worker
from tests.ray_session import stop_ray
from tests.runtime.test_comm_serialization import assert_same, payloads

pytestmark = pytest.mark.ray  # starts a two-node Ray of its own (not the shared session)


class Node(Worker):
    def __init__(self) -> None:
        _ = self.comm  # listen from the start, so a peer's first send finds this rank

    def node(self) -> int:
        return self.node_rank

    def transport(self, rank: int) -> str:
        return self.comm.transport_to(self.group_name, rank)

    def send_payloads(self, rank: int) -> None:
        for obj in payloads().values():
            self.send(obj, self.group_name, rank)

    def check_payloads(self, rank: int) -> int:
        for obj in payloads().values():
            assert_same(obj, self.recv(self.group_name, rank))
        return len(payloads())

    def put_items(self, ch: Channel, n: int) -> None:
        for i in range(n):
            ch.put({"from": self.rank, "i": i, "x": torch.full((100_000,), float(i))})

    def get_items(self, ch: Channel) -> list[tuple[int, int]]:
        return _drain(ch)

    def push_weights(self, ranks: list[int]) -> int:
        torch.manual_seed(0)
        model = torch.nn.Linear(300, 200)
        return send_weights(self.comm, model, self.group_name, ranks, bucket_bytes=64 << 10)

    def pull_weights(self) -> bool:
        torch.manual_seed(0)
        expected = torch.nn.Linear(300, 200)
        torch.manual_seed(1)
        model = torch.nn.Linear(300, 200)
        recv_weights(self.comm, self.group_name, 0, into=model)
        return all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.state_dict().values()))


def _drain(ch: Channel) -> list[tuple[int, int]]:
    got = []
    try:
        while True:
            item = ch.get()
            assert torch.equal(item["x"], torch.full((100_000,), float(item["i"])))
            got.append((item["from"], item["i"]))
    except ChannelClosed:
        return got


@pytest.fixture(scope="module")
def mn():
    stop_ray()  # the shared single-node session comes back on its next use
    raycluster = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 2})
    raycluster.add_node(num_cpus=2)
    raycluster.wait_for_nodes()
    cluster = Cluster(ClusterConfig(address=raycluster.address, cpu_devices_per_node=2))
    group = WorkerGroup(Node, cluster, "mn", placement="0,2,3")  # rank 0 on node 0; ranks 1, 2 on node 1
    yield group
    group.shutdown()
    stop_ray()
    raycluster.shutdown()


def test_ranks_sit_on_two_nodes_and_pick_transports_by_locality(mn):
    assert mn.node().wait() == [0, 1, 1]
    assert mn.transport(1, ranks=[0]).wait() == ["tcp"]
    assert mn.transport(2, ranks=[1]).wait() == ["shm"]


@pytest.mark.parametrize(("src", "dst"), [(0, 1), (1, 0), (1, 2)])
def test_every_payload_kind_crosses(mn, src, dst):
    sending = mn.send_payloads(dst, ranks=[src])
    assert mn.check_payloads(src, ranks=[dst]).wait(timeout=120) == [len(payloads())]
    sending.wait(timeout=60)


def test_channel_items_reach_consumers_on_both_nodes(mn):
    ch = Channel.create("mn-items", maxsize=8)  # hosted on node 0, beside the driver
    mine: list[tuple[int, int]] = []
    try:
        consuming = mn.get_items(ch, ranks=[2])  # node 1
        here = threading.Thread(target=lambda: mine.extend(_drain(ch)))  # node 0
        here.start()
        mn.put_items(ch, 12, ranks=[0, 1]).wait(timeout=120)  # one producer per node
        ch.close()
        (theirs,) = consuming.wait(timeout=120)
        here.join(timeout=120)
        assert sorted(theirs + mine) == sorted((r, i) for r in (0, 1) for i in range(12))
    finally:
        ch.destroy()


def test_weights_cross_nodes_bit_identical(mn):
    pulling = mn.pull_weights(ranks=[1, 2])
    assert mn.push_weights([1, 2], ranks=[0]).wait(timeout=120)[0] > 1
    assert pulling.wait(timeout=120) == [True, True]
