"""Rank processes reused across groups: a clean one serves the next group as a new process would; one that is
not clean (a thread left running, a call still running) is killed; ``idle_hosts: 0`` turns reuse off."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
import ray

from m2flow.runtime import WorkerGroup, host_pool
from m2flow.runtime.handle import CallFailure
from m2flow.runtime.worker import Worker
from tests.processes import process_gone
from tests.ray_session import shared_cluster

pytestmark = pytest.mark.ray


class Marks(Worker):
    """Leaves marks on its process: an environment variable, the CPU affinity, optionally a thread."""

    def __init__(self, leave_thread: bool = False) -> None:
        self.stop = threading.Event()
        if leave_thread:
            threading.Thread(target=self.stop.wait, daemon=True, name="left-behind").start()

    def state(self) -> dict:
        import torch

        return {"pid": os.getpid(), "group": self.group_name, "rank": self.rank, "mark": os.environ.get("MARK"),
                "affinity": sorted(os.sched_getaffinity(0)), "seed": torch.initial_seed(),
                "threads": int(os.environ["OMP_NUM_THREADS"])}

    def mark(self) -> None:
        os.environ["MARK"] = self.group_name
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        import torch

        torch.manual_seed(1234)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture(scope="module")
def cluster():
    return shared_cluster()


def _pooled(at_least: int, within: float = 20.0) -> bool:
    """Whether the pool has taken ``at_least`` hosts back since this process started, within ``within`` s."""
    deadline = time.monotonic() + within
    while host_pool.counts["pooled"] < at_least:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _fresh_state(cluster) -> dict:
    """What a rank sees in a process no group used before."""
    group = WorkerGroup(Marks, cluster, "pool-fresh", num_ranks=1, max_concurrency=3)
    try:
        return group.state().wait(timeout=60)[0]
    finally:
        ray.kill(group._hosts[0], no_restart=True)  # not pooled: a process that stays new for this test
        group._hosts = []


def test_a_clean_process_serves_the_next_group_as_a_new_process_would(cluster):
    fresh = _fresh_state(cluster)
    before = host_pool.counts["pooled"]
    first = WorkerGroup(Marks, cluster, "pool-first", num_ranks=1, num_threads=2)
    first_state = first.state().wait(timeout=60)[0]
    first.mark().wait(timeout=60)
    late, late_token = first._hosts[0], first._serving  # what a call the first group made late would reach
    first.shutdown()
    assert _pooled(before + 1)
    second = WorkerGroup(Marks, cluster, "pool-second", num_ranks=1)
    try:
        state = second.state().wait(timeout=60)[0]
        assert state["pid"] == first_state["pid"]  # the same process ...
        assert (state["group"], state["rank"], state["threads"]) == ("pool-second", 0, 1)  # ... serves the new rank
        assert state["mark"] is None  # the environment the first worker changed is put back
        assert state["affinity"] == fresh["affinity"]
        assert state["seed"] != 1234  # torch's generator is seeded afresh, as in a new process
        assert WorkerGroup.attach("pool-second", cluster).pids() == [state["pid"]]  # found by its group's name
        with pytest.raises(LookupError):
            WorkerGroup.attach("pool-first", cluster)
        refused = ray.get(late.call.remote(late_token, "state", (), {}))
        assert isinstance(refused, CallFailure) and "no longer serves" in str(refused.error)
    finally:
        second.shutdown()


def test_a_process_with_a_thread_left_running_is_killed_not_reused(cluster):
    group = WorkerGroup(Marks, cluster, "pool-thread", num_ranks=1, args=(True,))
    pid = group.pids()[0]
    killed = host_pool.counts["killed"]
    group.shutdown()
    assert process_gone(pid, within=30.0)
    assert host_pool.counts["killed"] > killed


def test_a_process_with_a_call_still_running_is_killed_not_reused(cluster):
    group = WorkerGroup(Marks, cluster, "pool-busy", num_ranks=1, max_concurrency=2)
    pid = group.pids()[0]
    group.sleep(60)
    time.sleep(0.5)  # the call has started
    group.shutdown()
    assert process_gone(pid, within=30.0)


def test_idle_hosts_0_starts_a_new_process_for_every_group(cluster):
    plain = dataclasses.replace(cluster.config, idle_hosts=0)
    original = cluster.config
    cluster.config = plain
    try:
        group = WorkerGroup(Marks, cluster, "pool-off", num_ranks=1)
        pid = group.pids()[0]
        group.shutdown()
        assert process_gone(pid, within=30.0)
    finally:
        cluster.config = original


def test_a_pooled_process_that_died_is_replaced_by_a_new_one(cluster):
    group = WorkerGroup(Marks, cluster, "pool-dies", num_ranks=1, max_concurrency=4)
    pid = group.pids()[0]
    before = host_pool.counts["pooled"]
    group.shutdown()
    assert _pooled(before + 1)
    os.kill(pid, 9)
    assert process_gone(pid, within=30.0)
    again = WorkerGroup(Marks, cluster, "pool-after", num_ranks=1, max_concurrency=4)
    try:
        assert again.state().wait(timeout=60)[0]["pid"] != pid
    finally:
        again.shutdown()


def test_clearing_the_pool_returns_after_every_hand_back_has_left_ray(cluster):
    """Ray is shut down right after ``clear`` (a run's end, the interpreter's exit): a hand-back thread still
    waiting inside Ray then could crash the process, so ``clear`` kills the hosts and waits for the threads."""
    group = WorkerGroup(Marks, cluster, "pool-clear", num_ranks=1, max_concurrency=1)
    pid = group.pids()[0]
    group.sleep(60)
    time.sleep(0.5)  # the one call slot is taken: the host's release queues behind the sleep
    group.shutdown()
    assert [t for t in threading.enumerate() if t.name == "m2flow-host-release"]  # waiting on the answer
    host_pool.clear()
    assert not [t for t in threading.enumerate() if t.name == "m2flow-host-release" and t.is_alive()]
    assert process_gone(pid, within=30.0)
