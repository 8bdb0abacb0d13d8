"""Point-to-point communication between workers on one node: every payload, order, death, weights."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from m2flow.runtime import WorkerError, WorkerGroup
from m2flow.runtime.comm import (
    CommTimeout,
    Communicator,
    MemoryRendezvous,
    PeerDiedError,
    recv_versioned_weights,
    recv_weights,
    send_weights,
)
from m2flow.runtime.worker import Worker
from tests.ray_session import shared_cluster
from tests.runtime.test_comm_serialization import assert_same, payloads


class Peer(Worker):
    """Sends and checks payloads by name, so both ends agree on what should arrive."""

    def use_transport(self, kind: str) -> None:
        old = getattr(self, "_m2flow_comm", None)
        if old is not None:
            old.close()
        self._m2flow_comm = Communicator(
            self.group_name, self.rank, self.node_ip, self.cluster_namespace, transport=kind, world_size=self.world_size
        )

    def transport(self, group: str, rank: int) -> str:
        return self.comm.transport_to(group, rank)

    def send_payloads(self, group: str, rank: int, names: list[str]) -> None:
        for name in names:
            self.send(payloads()[name], group, rank)

    def check_payloads(self, group: str, rank: int, names: list[str]) -> list[str]:
        for name in names:
            assert_same(payloads()[name], self.recv(group, rank))
        return names

    def send_sequence(self, group: str, rank: int, n: int) -> None:
        works = []
        for i in range(n):
            big = torch.full((100_000,), float(i)) if i % 3 == 0 else None  # alternate shm and inline
            works.append(self.comm.send({"i": i, "big": big}, group, rank, async_op=True))
        for w in works:
            w.wait()

    def recv_sequence(self, group: str, rank: int, n: int) -> list[int]:
        works = [self.recv(group, rank, async_op=True) for _ in range(n)]
        got = [w.wait(timeout=60)["i"] for w in reversed(works)]  # waiting out of order changes nothing
        return list(reversed(got))

    def send_then_die(self, group: str, rank: int) -> None:
        self.send("last words", group, rank)
        os._exit(1)

    def push_weights(self, ranks: list[int], bucket_bytes: int) -> tuple[int, str]:
        model = _model(seed=1)
        n = send_weights(self.comm, model, self.group_name, ranks, bucket_bytes=bucket_bytes)
        return n, _digest(model)

    def pull_weights(self, rank: int) -> str:
        model = _model(seed=100 + self.rank)  # different weights until synced
        recv_weights(self.comm, self.group_name, rank, into=model)
        return _digest(model)

    def recv_twice(self, group: str, rank: int) -> str:
        first = self.recv(group, rank)
        try:
            self.comm.recv(group, rank, timeout=60)
        except PeerDiedError as exc:
            return f"{first} | {exc}"
        return "no error"


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 33))
    model.to(torch.bfloat16)[0].to(torch.float32)  # mixed dtypes, as real checkpoints have
    return model


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def peers():
    group = WorkerGroup(Peer, shared_cluster(), "comm-peers", num_ranks=3)
    yield group
    group.shutdown()


@pytest.mark.parametrize("kind", ["auto", "tcp"])
def test_every_payload_kind_arrives_intact(peers, kind):
    peers.use_transport(kind).wait()
    names = sorted(payloads())
    assert peers.transport("comm-peers", 1, ranks=[0]).wait() == ["shm" if kind == "auto" else "tcp"]
    sending = peers.send_payloads("comm-peers", 1, names, ranks=[0])
    assert peers.check_payloads("comm-peers", 0, names, ranks=[1]).wait() == [names]
    sending.wait()


def test_order_is_preserved_across_inline_and_shared_memory_messages(peers):
    peers.use_transport("auto").wait()
    sending = peers.send_sequence("comm-peers", 1, 60, ranks=[0])
    assert peers.recv_sequence("comm-peers", 0, 60, ranks=[1]).wait() == [list(range(60))]
    sending.wait()


def test_in_process_peers_get_the_object_itself():
    rdv = MemoryRendezvous("t-local")
    a = Communicator("local-a", 0, namespace="t-local", rendezvous=rdv)
    b = Communicator("local-b", 0, namespace="t-local", rendezvous=rdv)
    try:
        assert a.transport_to("local-b", 0) == "inprocess"
        obj = {"t": torch.ones(3)}
        a.send(obj, "local-b", 0)
        a.send(2, "local-b", 0)
        assert b.recv("local-a", 0) is obj
        assert b.recv("local-a", 0, async_op=True).wait() == 2
    finally:
        a.close()
        b.close()


def test_in_process_peers_carry_every_payload_kind_and_broadcast():
    rdv = MemoryRendezvous("t-kinds")
    a = Communicator("local-a", 0, namespace="t-kinds", rendezvous=rdv)
    bs = [Communicator("local-b", r, namespace="t-kinds", rendezvous=rdv, world_size=2) for r in range(2)]
    try:
        for obj in payloads().values():
            a.send(obj, "local-b", 1)
            assert_same(obj, bs[1].recv("local-a", 0))
        a.broadcast("to all", "local-b")  # every rank, from the published world size
        assert [b.recv("local-a", 0) for b in bs] == ["to all", "to all"]
    finally:
        for c in [a, *bs]:
            c.close()


def test_a_versioned_weight_stream_is_probed_without_waiting_and_names_its_version():
    # A rollout polls between decoding steps: ``pending`` says a stream has arrived, never blocking; the
    # stream names the version it carries, and a receiver that does not ask passes over it.
    rdv = MemoryRendezvous("t-versioned")
    a = Communicator("w-src", 0, namespace="t-versioned", rendezvous=rdv)
    b = Communicator("w-dst", 0, namespace="t-versioned", rendezvous=rdv)
    try:
        src, dst = _model(1), _model(2)
        assert b.pending("w-src", 0) == 0
        buckets = send_weights(a, src, "w-dst", [0], bucket_bytes=8 << 10, version=7)
        assert b.pending("w-src", 0) == buckets + 1  # the version, then the buckets: arrived, none received
        version, got = recv_versioned_weights(b, "w-src", 0, into=dst)
        assert version == 7 and _digest(dst) == _digest(src) and len(got) == len(src.state_dict())
        assert b.pending("w-src", 0) == 0
        send_weights(a, _model(3), "w-dst", [0], version=8)
        assert recv_weights(b, "w-src", 0, into=dst) and _digest(dst) == _digest(_model(3))
        send_weights(a, src, "w-dst", [0])
        assert recv_versioned_weights(b, "w-src", 0)[0] is None  # sent without one
    finally:
        a.close()
        b.close()


def test_sending_to_a_rank_that_never_starts_fails_naming_it():
    a = Communicator("lonely", 0, namespace="t-absent", rendezvous=MemoryRendezvous("t-absent"), connect_timeout=0.3)
    try:
        with pytest.raises(CommTimeout, match=r"nobody\[3\]"):
            a.send("hello?", "nobody", 3)
    finally:
        a.close()


def test_receiver_of_a_dead_sender_gets_an_error_naming_it(peers):
    dying = WorkerGroup(Peer, shared_cluster(), "comm-dying", num_ranks=1)
    try:
        receiving = peers.recv_twice("comm-dying", 0, ranks=[2])
        died = dying.send_then_die("comm-peers", 2)
        (message,) = receiving.wait(timeout=90)
        assert message.startswith("last words | ")
        assert "comm-dying[0]" in message and "died" in message
        with pytest.raises(WorkerError):
            died.wait(timeout=30)
    finally:
        dying.shutdown()


def test_weight_broadcast_arrives_bit_identical_in_bounded_buckets(peers):
    peers.use_transport("auto").wait()
    pulled = peers.pull_weights(0, ranks=[1, 2])
    ((buckets, digest),) = peers.push_weights([1, 2], 8 << 10, ranks=[0]).wait(timeout=120)
    assert pulled.wait(timeout=120) == [digest, digest]
    assert buckets >= 3  # the 8 KiB bound split the model
