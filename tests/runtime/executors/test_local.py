"""LocalExecutor: ranks as objects in this process, each served in order by its own thread, no Ray."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from pathlib import Path

import pytest
import torch
from ray.exceptions import GetTimeoutError

from m2flow.runtime import Worker
from m2flow.runtime.channel import Channel
from m2flow.runtime.comm import recv_weights, send_weights
from m2flow.runtime.comm.collectives import ExchangeSum
from m2flow.runtime.errors import WorkerError
from m2flow.runtime.executors import GroupSpec, LocalExecutor, RayExecutor, make_executor
from m2flow.runtime.placement import PlacementError
from tests.runtime.test_device_lock import Stateful


GATES: dict[str, threading.Barrier] = {}  # by name: constructor arguments are copied per rank


class Recorder(Worker):
    """Records what ran when, on which thread; its identity is known in ``__init__``."""

    def __init__(self, tag: str = "", gate: str | None = None, shared: list | None = None) -> None:
        self.rank_at_init = self.rank
        self.world_at_init = self.world_size
        self.tag = tag
        self.gate = GATES[gate] if gate else None
        self.shared = shared
        self.calls: list[tuple[int, float, float]] = []

    def step(self, i: int, hold_s: float = 0.0) -> int:
        start = time.perf_counter()
        time.sleep(hold_s)
        self.calls.append((i, start, time.perf_counter()))
        return i * 10 + self.rank

    def history(self) -> list[tuple[int, float, float]]:
        return list(self.calls)

    def identity(self) -> tuple[int, int, str, str]:
        return self.rank_at_init, self.world_at_init, self.tag, threading.current_thread().name

    def meet(self) -> int:
        assert self.gate is not None
        return self.gate.wait(timeout=10)  # passes only when every rank is inside at once

    def fail_on(self, rank: int, hold_s: float = 0.0) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        time.sleep(hold_s)
        return self.rank

    def append_rank(self) -> None:
        assert self.shared is not None
        self.shared.append(self.rank)

    def seen(self) -> list:
        return list(self.shared or [])

    def say(self, text: str) -> None:
        self.log.info("%s from rank %d", text, self.rank)


class Broken(Worker):
    def __init__(self) -> None:
        raise KeyError("no such thing")


class Distributed(Worker):
    def __init__(self) -> None:
        self.init_process_group()


@pytest.fixture
def executor():
    ex = LocalExecutor()
    yield ex
    ex.shutdown()


def _launch(ex: LocalExecutor, tmp_path: Path, specs: dict[str, GroupSpec], placement: str):
    plan = ex.placement(placement, components=list(specs))
    names = {c: f"{c}-{id(ex)}" for c in specs}
    return ex.launch(names, plan, specs, tmp_path / "logs")


def test_context_is_set_before_init_and_calls_run_on_the_ranks_own_thread(executor, tmp_path) -> None:
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder, ("x",))}, "a: 0-2")["a"]
    assert g.world_size == 3
    assert [(c.rank, c.world_size, c.node_rank, c.devices) for c in g.contexts] == [
        (0, 3, 0, (0,)), (1, 3, 0, (1,)), (2, 3, 0, (2,))]
    ids = g.identity().wait(timeout=10)
    assert [i[:3] for i in ids] == [(0, 3, "x"), (1, 3, "x"), (2, 3, "x")]
    assert len({i[3] for i in ids}) == 3 and threading.current_thread().name not in {i[3] for i in ids}
    import os

    assert g.pids() == [os.getpid()] * 3


def test_calls_of_one_rank_run_in_submission_order(executor, tmp_path) -> None:
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder)}, "a: 0-1")["a"]
    # Longer holds first: a rank that ran its calls side by side would finish them out of order.
    handles = [g.step(i, 0.03 * (5 - i)) for i in range(5)]
    assert [h.wait(timeout=30) for h in handles] == [[i * 10, i * 10 + 1] for i in range(5)]
    for calls in g.history().wait(timeout=10):
        assert [i for i, _, _ in calls] == list(range(5))
        for (_, _, end), (_, start, _) in zip(calls, calls[1:]):
            assert end <= start  # one at a time


def test_ranks_run_concurrently(executor, tmp_path) -> None:
    GATES["three"] = threading.Barrier(3)
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder, (), {"gate": "three"})}, "a: 0-2")["a"]
    assert sorted(g.meet().wait(timeout=20)) == [0, 1, 2]


def test_each_rank_gets_its_own_copy_of_the_constructor_arguments(executor, tmp_path) -> None:
    shared: list[int] = []
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder, (), {"shared": shared})}, "a: 0-1")["a"]
    g.append_rank().wait(timeout=10)
    assert g.seen().wait(timeout=10) == [[0], [1]] and shared == []


def test_handles_offer_ranks_scatter_await_done_and_timeout(executor, tmp_path) -> None:
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder)}, "a: 0-2")["a"]
    assert g.step(1, ranks=[2, 0]).wait(timeout=10) == [12, 10]
    assert g.execute_each("step", [(1,), (2,), (3,)]).wait(timeout=10) == [10, 21, 32]
    assert g.execute("step", 4, ranks=[1]).wait(timeout=10) == [41]

    async def both():
        return await g.step(5), await g.step(6, ranks=[1])

    assert asyncio.run(both()) == ([50, 51, 52], [61])
    slow = g.step(7, 0.5, ranks=[0])
    assert not slow.done()
    with pytest.raises(GetTimeoutError, match=r"still running on ranks \[0\]"):
        slow.wait(timeout=0.05)
    assert slow.wait(timeout=10) == [70] and slow.done()
    with pytest.raises(ValueError, match="cannot call ranks"):
        g.step(1, ranks=[3])


def test_the_first_failure_raises_with_group_rank_node_and_traceback(executor, tmp_path) -> None:
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder)}, "a: 0-1")["a"]
    t0 = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        g.fail_on(1, 3.0).wait(timeout=30)
    assert time.perf_counter() - t0 < 2.5  # raised while rank 0 is still sleeping
    err = info.value
    assert (err.group, err.rank, err.node, err.exc_type) == (g.name, 1, "0 (127.0.0.1)", "ValueError")
    assert "rank 1 refuses" in str(err) and "in fail_on" in err.remote_traceback
    assert err.raised("builtins.ValueError") and not err.raised("builtins.TypeError")
    again = pickle.loads(pickle.dumps(err))  # as a Ray actor hands it back
    assert again.exc_classes == err.exc_classes and again.raised("builtins.ValueError")

    async def failing():
        return await g.fail_on(0)

    with pytest.raises(WorkerError, match="rank 0 refuses"):
        asyncio.run(failing())
    assert g.step(1).wait(timeout=10) == [10, 11]  # a failed call leaves the rank serving


def test_a_failing_launch_raises_and_leaves_nothing_running(executor, tmp_path) -> None:
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(WorkerError, match="KeyError") as info:
        _launch(executor, tmp_path, {"a": GroupSpec(Recorder), "b": GroupSpec(Broken)}, "a: 0, b: 1")
    assert info.value.rank == 0 and info.value.group.startswith("b-")
    time.sleep(0.1)
    assert {t.name for t in threading.enumerate() if t.name.startswith("m2flow-a-")} - before == set()


def test_torch_distributed_and_foreign_gpus_are_refused_at_launch(executor, tmp_path) -> None:
    with pytest.raises(WorkerError, match="torch.distributed needs a process per rank"):
        _launch(executor, tmp_path, {"a": GroupSpec(Distributed)}, "a: 0-1")


def test_each_rank_logs_to_its_own_file(executor, tmp_path) -> None:
    import logging

    logging.getLogger("m2flow").setLevel(logging.INFO)
    g = _launch(executor, tmp_path, {"a": GroupSpec(Recorder)}, "a: 0-1")["a"]
    g.say("hello").wait(timeout=10)
    g.shutdown()
    for r in range(2):
        text = (tmp_path / "logs" / f"{g.name}.{r}.log").read_text()
        assert f"hello from rank {r}" in text and f"hello from rank {1 - r}" not in text


class Peer(Worker):
    """Sends and receives objects, weights and sums to and from other in-process ranks."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.model.weight.fill_(float(self.rank))
            self.model.bias.fill_(-1.0)

    def transport(self, group: str, rank: int) -> str:
        return self.comm.transport_to(group, rank)

    def send_to(self, obj: object, group: str, rank: int) -> None:
        self.send(obj, group, rank)

    def recv_from(self, group: str, rank: int) -> object:
        return self.recv(group, rank)

    def push_weights(self, group: str, ranks: list[int]) -> int:
        return send_weights(self.comm, self.model, group, ranks, bucket_bytes=16)

    def pull_weights(self, group: str, rank: int) -> list[float]:
        recv_weights(self.comm, group, rank, into=self.model)
        return self.model.weight.flatten().tolist() + self.model.bias.tolist()

    def summed(self, value: float) -> list[float]:
        t = torch.full((4,), value)
        ExchangeSum(self.comm, self.group_name, self.rank, self.world_size)(t)
        return t.tolist()

    def put(self, channel: Channel, items: list[int]) -> None:
        for i in items:
            channel.put(i)

    def take(self, channel: Channel, n: int) -> list[int]:
        return [channel.get() for _ in range(n)]


def test_comm_between_ranks_of_one_process(executor, tmp_path) -> None:
    groups = _launch(executor, tmp_path, {"src": GroupSpec(Peer), "dst": GroupSpec(Peer)}, "src: 0, dst: 0-1")
    src, dst = groups["src"], groups["dst"]
    assert src.transport(dst.name, 1).wait(timeout=10) == ["inprocess"]
    receiving = dst.recv_from(src.name, 0, ranks=[1])
    src.send_to({"x": torch.arange(3)}, dst.name, 1).wait(timeout=10)
    got = receiving.wait(timeout=10)[0]
    assert torch.equal(got["x"], torch.arange(3))
    pulling = dst.pull_weights(src.name, 0)
    assert src.push_weights(dst.name, [0, 1]).wait(timeout=10) == [2]  # two buckets of 16 bytes at most
    assert pulling.wait(timeout=10) == [[0.0] * 6 + [-1.0, -1.0]] * 2
    assert dst.summed(0.0).wait(timeout=10) == [[0.0] * 4] * 2
    assert dst.execute_each("summed", [(1.5,), (2.0,)]).wait(timeout=10) == [[3.5] * 4] * 2


def test_channels_created_while_open_are_hosted_in_process(executor, tmp_path) -> None:
    channel = Channel.create(f"local-channel-{id(executor)}")
    try:
        assert channel.address.actor_name is None
        groups = _launch(executor, tmp_path, {"p": GroupSpec(Peer), "c": GroupSpec(Peer)}, "p: 0, c: 1")
        taking = groups["c"].take(channel, 5)
        groups["p"].put(channel, list(range(5))).wait(timeout=10)
        assert taking.wait(timeout=20) == [[0, 1, 2, 3, 4]]
    finally:
        channel.destroy()


def test_collocated_ranks_take_turns_on_their_device(executor, tmp_path) -> None:
    groups = _launch(executor, tmp_path, {"actor": GroupSpec(Stateful), "rollout": GroupSpec(Stateful)},
                     "actor,rollout: 0-1")
    ha, hr = groups["actor"].work(5, 0.02), groups["rollout"].work(5, 0.02)
    spans_a, spans_r = ha.wait(timeout=60), hr.wait(timeout=60)
    for rank in range(2):  # rank r of both groups shares device r, in two threads of this process
        for s1, e1 in spans_a[rank]:
            for s2, e2 in spans_r[rank]:
                assert e1 <= s2 or e2 <= s1, f"turns overlap on device {rank}"
    assert [e for e, _ in groups["actor"].recorded().wait(timeout=10)[0]] == ["onload", "offload"] * 5


def test_device_lock_excludes_threads_of_one_process() -> None:
    import uuid

    from m2flow.runtime import DeviceLock

    cluster_id = uuid.uuid4().hex[:12]
    spans: list[tuple[float, float]] = []

    def hold() -> None:
        lock = DeviceLock(cluster_id, [3])
        for _ in range(5):
            with lock:
                start = time.perf_counter()
                time.sleep(0.01)
                spans.append((start, time.perf_counter()))

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    spans.sort()
    assert len(spans) == 15
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))


def test_make_executor_and_the_local_placement(tmp_path) -> None:
    import ray

    ray_was_up = ray.is_initialized()
    ex = make_executor(" local ")
    try:
        assert isinstance(ex, LocalExecutor) and ex.kind == "local"
        plan = ex.placement("local", components=["env", "rollout", "actor"])
        assert plan.mode == "collocated"
        assert {c: [(r.node_rank, r.local_devices) for r in plan[c].ranks] for c in plan.components} == {
            c: [(0, (0,))] for c in ("env", "rollout", "actor")}
        g = _launch(ex, tmp_path, {"a": GroupSpec(Recorder)}, "local")["a"]
        assert g.step(2).wait(timeout=10) == [20]
    finally:
        ex.shutdown()
    assert ray.is_initialized() == ray_was_up  # the local executor never starts Ray
    other = LocalExecutor()
    try:
        with pytest.raises(PlacementError, match="needs the list of components"):
            other.placement("local")
    finally:
        other.shutdown()  # an open local executor keeps this process's channels in process
    assert make_executor.__module__ == "m2flow.runtime.executors"
    assert RayExecutor.kind == "ray"


def test_traced_ranks_write_a_shard_each_like_processes(tmp_path) -> None:
    from m2flow.runtime.trace import get_tracer, iter_spans, load_trace, merge_traces, prepare_trace_dir

    trace_dir = prepare_trace_dir(tmp_path)
    ex = LocalExecutor()
    try:
        plan = ex.placement("a: 0-1", components=["a"])
        g = ex.launch({"a": "traced"}, plan, {"a": GroupSpec(Recorder)}, tmp_path / "logs", trace_dir)["a"]
        g.step(1).wait(timeout=10)
        assert not get_tracer().enabled  # the driver's thread keeps the process's (disabled) tracer
    finally:
        ex.shutdown()
    trace = load_trace(merge_traces(tmp_path))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert {"traced[0] @node0", "traced[1] @node0"} <= names
    steps = [s for s in iter_spans(trace) if s["name"] == "step"]
    assert len(steps) == 2 and len({s["pid"] for s in steps}) == 2  # one span on each rank's row
