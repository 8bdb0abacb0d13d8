"""WorkerGroup on a real local Ray: launch under each placement kind, call, gather, fail loudly."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import ray

from m2flow.runtime import WorkerDiedError, WorkerError, WorkerGroup
from m2flow.runtime.worker import Worker
from tests.ray_session import shared_cluster


class Echo(Worker):
    """Reports what it knows about itself."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale
        self.rank_at_init = self.rank  # the context exists before __init__ runs

    def whoami(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "group": self.group_name,
            "devices": self.devices,
            "rank_at_init": self.rank_at_init,
            "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
            "niceness": os.nice(0),
        }

    def times(self, x: int, plus: int = 0) -> int:
        return self.rank * x * self.scale + plus

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return self.rank

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def allreduce_rank(self) -> float:
        import torch
        import torch.distributed as dist

        self.init_process_group()
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return t.item()

    def attach_and_call(self, group: str) -> list[int]:
        other = WorkerGroup.attach(group, namespace=self.cluster_namespace)
        return other.times(1).wait()


class FailsInInit(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("cannot start on rank 1")


@pytest.fixture(scope="module")
def echo():
    cluster = shared_cluster()
    group = WorkerGroup(Echo, cluster, "echo", placement="0-1:0-3", args=(10,))
    yield group
    group.shutdown()


def test_ranks_know_themselves_and_results_come_in_rank_order(echo):
    infos = echo.whoami().wait()
    assert [i["rank"] for i in infos] == [0, 1, 2, 3]
    assert all(i["world_size"] == 4 and i["group"] == "echo" for i in infos)
    assert [i["devices"] for i in infos] == [(0,), (0,), (1,), (1,)]
    assert [i["rank_at_init"] for i in infos] == [0, 1, 2, 3]
    assert [i["env"]["RANK"] for i in infos] == ["0", "1", "2", "3"]
    assert len({(i["env"]["MASTER_ADDR"], i["env"]["MASTER_PORT"]) for i in infos}) == 1
    assert echo.times(2, plus=1).wait() == [1, 21, 41, 61]
    # Workers of a local Ray run at the driver's priority, not behind every other process.
    assert all(i["niceness"] == os.nice(0) for i in infos)


def test_chosen_ranks_and_scatter(echo):
    assert echo.execute("times", 3, ranks=[3, 1]).wait() == [90, 30]
    assert echo.execute_each("times", [(1,), (2,)], ranks=[1, 2]).wait() == [10, 40]
    with pytest.raises(ValueError, match="ranks 0-3"):
        echo.execute("times", 1, ranks=[4])
    with pytest.raises(ValueError, match="2 argument tuples for 1 rank"):
        echo.execute_each("times", [(1,), (2,)], ranks=[0])


def test_async_handles(echo):
    handle = echo.sleep(0.2)
    assert not handle.done()
    assert handle.wait() == [0, 1, 2, 3]
    assert handle.done()

    async def both():
        return await asyncio.gather(echo.times(1), echo.times(2))

    assert asyncio.run(both()) == [[0, 10, 20, 30], [0, 20, 40, 60]]


def test_torch_distributed_inside_a_group(echo):
    # gloo all-reduce of rank+1 over 4 ranks: 1+2+3+4
    assert echo.allreduce_rank().wait() == [10.0] * 4


def test_each_placement_kind_launches(cluster):
    plan = cluster.placement("actor: 0-3:0-1, env: 4-7", components=["actor", "env"])
    assert plan.mode == "disaggregated"
    actor = WorkerGroup(Echo, cluster, "pk_actor", placement=plan["actor"])
    env = WorkerGroup(Echo, cluster, "pk_env", placement=plan["env"])
    try:
        assert [i["devices"] for i in actor.whoami().wait()] == [(0, 1), (2, 3)]
        assert [i["devices"] for i in env.whoami().wait()] == [(4,), (5,), (6,), (7,)]
    finally:
        actor.shutdown()
        env.shutdown()
    single = WorkerGroup(Echo, cluster, "pk_num", num_ranks=2)
    try:
        assert [i["devices"] for i in single.whoami().wait()] == [(0,), (1,)]
    finally:
        single.shutdown()


def test_reattach_from_another_process(echo, cluster):
    other = WorkerGroup(Echo, cluster, "attacher", num_ranks=1)
    try:
        assert other.attach_and_call("echo").wait() == [[0, 10, 20, 30]]
    finally:
        other.shutdown()
    again = WorkerGroup.attach("echo", cluster)
    assert again.world_size == 4 and again.times(1).wait() == [0, 10, 20, 30]
    with pytest.raises(LookupError, match="no worker group named 'missing'"):
        WorkerGroup.attach("missing", cluster)


def test_a_raising_worker_names_group_rank_node_and_traceback(echo):
    with pytest.raises(WorkerError) as info:
        echo.fail_on(2).wait(timeout=30)
    err = info.value
    assert (err.group, err.rank, err.exc_type) == ("echo", 2, "ValueError")
    # The classes of the worker's exception cross the process boundary, so the caller can tell bad input.
    assert err.raised("builtins.ValueError") and err.raised("builtins.Exception") and not err.raised("builtins.OSError")
    text = str(err)
    assert "echo[rank 2]" in text and "on node 0" in text
    assert "rank 2 refuses" in text and "in fail_on" in text  # the worker's own traceback
    # the group is still usable afterwards
    assert echo.times(1).wait() == [0, 10, 20, 30]


def test_failure_raises_without_waiting_for_slow_ranks(cluster):
    group = WorkerGroup(Echo, cluster, "slowfail", num_ranks=2)
    try:
        group.execute("sleep", 60, ranks=[0])
        bad = group.fail_on(1)  # rank 0 is busy for a minute; rank 1 fails at once
        with pytest.raises(WorkerError, match="rank 1 refuses"):
            bad.wait(timeout=30)
    finally:
        group.shutdown()


def test_init_failure_is_reported(cluster):
    with pytest.raises(WorkerError, match=r"finit\[rank 1\].*cannot start on rank 1"):
        WorkerGroup(FailsInInit, cluster, "finit", num_ranks=2)
    with pytest.raises(LookupError):  # the half-started group was torn down
        for _ in range(50):
            WorkerGroup.attach("finit", cluster)
            time.sleep(0.1)


def test_a_killed_worker_is_reported_within_seconds(cluster):
    group = WorkerGroup(Echo, cluster, "victim", num_ranks=2)
    try:
        pid = group.pids()[1]
        handle = group.sleep(60)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            handle.wait(timeout=30)  # a hang would surface as GetTimeoutError instead
        err = info.value
        assert (err.group, err.rank) == ("victim", 1)
        assert "victim[rank 1] on node 0" in str(err) and "died" in str(err)
    finally:
        group.shutdown()


def test_bad_worker_class_and_threads(cluster):
    class NotAWorker:
        pass

    with pytest.raises(TypeError, match="subclass of Worker"):
        WorkerGroup(NotAWorker, cluster, "bad", num_ranks=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        WorkerGroup(Echo, cluster, "bad", num_ranks=1, num_threads=0)


def test_local_ray_is_bound_to_loopback(cluster):
    assert {n.ip for n in cluster.nodes} == {"127.0.0.1"}
    assert ray.is_initialized()


class _Titled(Worker):
    def title(self) -> str:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode().strip()


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0].decode().strip()


def test_a_rank_process_is_titled_by_its_group_and_rank(cluster):
    group = WorkerGroup(_Titled, cluster, "titled", num_ranks=2)
    try:
        assert group.title().wait(timeout=60) == ["ray::titled[0].title", "ray::titled[1].title"]  # during a call
        pids = group.pids()
        assert [_cmdline(pid) for pid in pids] == ["ray::titled[0]", "ray::titled[1]"]  # and between calls
        group.title().wait(timeout=60)
        assert [_cmdline(pid) for pid in pids] == ["ray::titled[0]", "ray::titled[1]"]
    finally:
        group.shutdown()


def test_calls_leave_no_record_in_rays_task_table_unless_asked(cluster, monkeypatch):
    """Ray's control store keeps a record of every task it hears of; m2flow's calls are not reported
    (``cluster.task_events``: False), which kept its memory from growing with the number of calls."""
    import time

    def recorded() -> set[str]:
        return {str(e.get("cat")) for e in ray.timeline()}

    quiet = WorkerGroup(_Titled, cluster, "untracked", num_ranks=1)
    quiet.title().wait(timeout=60)
    monkeypatch.setattr(cluster.config, "task_events", True)
    tracked = WorkerGroup(_Titled, cluster, "tracked", num_ranks=1)
    try:
        tracked.title().wait(timeout=60)
        deadline = time.monotonic() + 30
        while "task::tracked[0].title" not in recorded() and time.monotonic() < deadline:
            time.sleep(0.5)  # task events reach the control store in batches, about once a second
        seen = recorded()
        assert "task::tracked[0].title" in seen
        assert "task::untracked[0].title" not in seen  # reported before the tracked one, had it been
    finally:
        quiet.shutdown()
        tracked.shutdown()
