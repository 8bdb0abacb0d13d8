"""Context switching: collocated groups take the device lock in turn; offload/onload bracket each turn."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import time
import uuid

import pytest

from m2flow.runtime import Cluster, DeviceLock, WorkerGroup, device_turn
from m2flow.runtime.device_lock import lock_dir, remove_lock_dir
from m2flow.runtime.worker import Worker


@pytest.fixture
def lock_id():
    """A fresh cluster id for locks taken outside a Cluster; its directory goes afterwards."""
    cid = uuid.uuid4().hex
    yield cid
    remove_lock_dir(cid)


class Stateful(Worker):
    """Holds 'device state' and records every turn and every offload/onload."""

    def __init__(self) -> None:
        self.on_device = False
        self.events: list[tuple[str, float]] = []

    def onload(self) -> None:
        assert self.device_lock.held, "onload outside the device lock"
        self.on_device = True
        self.events.append(("onload", time.time()))

    def offload(self) -> None:
        assert self.device_lock.held, "offload outside the device lock"
        self.on_device = False
        self.events.append(("offload", time.time()))

    def work(self, turns: int, hold_s: float) -> list[tuple[float, float]]:
        spans = []
        for _ in range(turns):
            with self.device_turn(offload_after=True):
                assert self.on_device
                start = time.time()
                time.sleep(hold_s)
                spans.append((start, time.time()))
            assert not self.on_device
        return spans

    def recorded(self) -> list[tuple[str, float]]:
        return self.events


def test_collocated_groups_never_overlap_on_a_device(cluster):
    plan = cluster.placement("actor,rollout: 0-1", components=["actor", "rollout"])
    assert plan.mode == "collocated"
    actor = WorkerGroup(Stateful, cluster, "lock_actor", placement=plan["actor"])
    rollout = WorkerGroup(Stateful, cluster, "lock_rollout", placement=plan["rollout"])
    try:
        ha, hr = actor.work(6, 0.02), rollout.work(6, 0.02)
        spans_a, spans_r = ha.wait(timeout=60), hr.wait(timeout=60)
        for rank in range(2):  # rank r of both groups shares device r
            a, r = spans_a[rank], spans_r[rank]
            assert len(a) == len(r) == 6
            for s1, e1 in a:
                for s2, e2 in r:
                    assert e1 <= s2 or e2 <= s1, f"turns overlap on device {rank}"
        events = actor.recorded().wait()[0]
        assert [e for e, _ in events] == ["onload", "offload"] * 6
    finally:
        actor.shutdown()
        rollout.shutdown()


def _hold(cluster_id: str, devices: list[int], hold_s: float, out: mp.Queue) -> None:
    lock = DeviceLock(cluster_id, devices, owner=f"p{os.getpid()}")
    with lock:
        start = time.time()
        time.sleep(hold_s)
        out.put((start, time.time()))


def test_lock_excludes_processes_and_dies_with_its_holder(lock_id):
    cid = lock_id
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(cid, [0, 1], 0.3, q)) for _ in range(2)]
    procs.append(ctx.Process(target=_hold, args=(cid, [1], 0.3, q)))
    for p in procs:
        p.start()
    spans = sorted(q.get(timeout=30) for _ in procs)
    for p in procs:
        p.join()
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        assert e1 <= s2, "two holders of device 1 overlapped"

    # A holder that is killed does not leave the device locked.
    sink = ctx.Queue()  # kept referenced until the child has started
    holder = ctx.Process(target=_hold, args=(cid, [3], 60.0, sink))
    holder.start()
    probe = DeviceLock(cid, [3])
    deadline = time.time() + 20
    while time.time() < deadline:  # wait until the child holds it
        try:
            probe.acquire(timeout=0.01)
            probe.release()
            time.sleep(0.05)
        except TimeoutError:
            break
    with pytest.raises(TimeoutError, match=r"devices \[3\] still held"):
        probe.acquire(timeout=0.2)
    holder.kill()
    holder.join()
    probe.acquire(timeout=10)
    probe.release()
    assert len(probe.history) >= 1


class _State:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def offload(self) -> None:
        self.calls.append("offload")

    def onload(self) -> None:
        self.calls.append("onload")


def test_device_turn_offloads_even_when_the_block_raises(lock_id):
    lock = DeviceLock(lock_id, [0])
    state = _State()
    with pytest.raises(RuntimeError, match="inside"):
        with device_turn(lock, state, offload_after=True):
            raise RuntimeError("inside")
    assert state.calls == ["onload", "offload"]
    assert not lock.held
    with device_turn(lock, state):
        pass
    assert state.calls == ["onload", "offload", "onload"]


def test_lock_misuse(lock_id):
    with pytest.raises(ValueError, match="at least one device"):
        DeviceLock("x", [])
    with pytest.raises(RuntimeError, match="not held"):
        DeviceLock(lock_id, [0]).release()


def test_a_runs_lock_directory_is_private_and_removed_at_shutdown(cluster):
    run = Cluster(cluster.config)  # attaches to the running Ray: its own cluster id, its own locks
    group = WorkerGroup(Stateful, run, "lock_cleanup", num_ranks=1)
    try:
        group.work(1, 0.0).wait(timeout=60)
        directory = lock_dir(run.cluster_id)
        assert directory.is_dir()
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in directory.iterdir())
        held = DeviceLock(run.cluster_id, [0])
        with held:  # a worker still holding a lock keeps the directory
            assert not remove_lock_dir(run.cluster_id) and directory.is_dir()
    finally:
        group.shutdown()
    run.shutdown()
    assert not directory.exists()
