"""A rank frozen with SIGSTOP by the fault-injection point: the wait on it ends at its deadline, the
group's shutdown does not wait on it (the process is killed), and a channel it is connected to closes
at once for a teardown, where a close that waits for every client's confirmation would hang."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from m2flow.runtime.faults import ENV, parse, read_marker
from tests.ray_session import shared_cluster
from tests.workflows.frozen import freezing
from tests.processes import process_gone

pytestmark = pytest.mark.ray


def test_points_parse_and_bad_ones_are_named():
    folder, points = parse("/tmp/m:rollout.generate@2,actor.save_checkpoint,rollout.reward/score")
    assert folder == Path("/tmp/m")
    assert points == [("rollout", "generate", 2), ("actor", "save_checkpoint", 1), ("rollout", "reward/score", 1)]
    for bad in ("rollout.generate", "/tmp/m:generate", "/tmp/m:rollout.generate@x"):
        with pytest.raises(ValueError, match=ENV):
            parse(bad)


def test_a_frozen_rank_is_caught_by_its_deadline_and_killed_without_waiting_on_it(tmp_path, monkeypatch):
    from m2flow.runtime.waiting import gather
    from m2flow.runtime import Worker, WorkerGroup
    from m2flow.runtime.channel import Channel
    from m2flow.runtime.comm.errors import CommTimeout
    from m2flow.runtime.errors import WorkerHungError

    class Client(Worker):
        def connect(self, channel: Channel) -> None:
            channel.put("hello")  # this process is now a client the channel's host knows

        def work(self) -> int:
            return 1

    channel = Channel.create(f"frozen-{os.getpid()}")
    with freezing(tmp_path, monkeypatch, ["client.work"]) as plan:
        group = WorkerGroup(Client, shared_cluster(), f"client-{os.getpid()}", placement="0")
        try:
            gather([group.connect(channel)], timeout=30.0)
            start = time.monotonic()
            with pytest.raises(WorkerHungError, match=r"work\(\) gave no result within 1s during a test") as info:
                gather([group.work(), group.work()], timeout=1.0, what="a test")  # the second queued behind
            caught = time.monotonic() - start
            frozen = read_marker(plan.folder / "client.work")
            assert frozen.pid != os.getpid()
            assert 1.0 <= caught < 4.0 and info.value.rank == 0
            # A close that waits for every client to confirm its puts waits on the frozen one...
            with pytest.raises(CommTimeout):
                channel.close(timeout=1.0)
            # ... a teardown's close does not.
            start = time.monotonic()
            channel.close(sync=False, timeout=5.0)
            assert time.monotonic() - start < 2.0 and channel.closed
        finally:
            start = time.monotonic()
            group.shutdown()
            assert time.monotonic() - start < 2.0  # no call to the frozen rank: it is killed
            channel.destroy()
        assert process_gone(frozen.pid, within=30.0)  # Ray kills a stopped process too (after its grace period)
