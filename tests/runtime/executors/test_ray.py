"""launch_groups: every group starts, or none is left running and the first error is raised."""

from __future__ import annotations

import pytest

from m2flow.runtime import Worker
from m2flow.runtime.errors import WorkerError
from m2flow.runtime.executors import GroupSpec, launch_groups


class Echo(Worker):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def who(self) -> str:
        return f"{self.tag}{self.rank}"


class Broken(Worker):
    def __init__(self) -> None:
        raise ValueError("cannot build")


class Holder(Worker):
    def __init__(self) -> None:
        self.table = [[i] for i in range(10_000)]  # what a worker builds once and keeps

    def frozen(self) -> int:
        import gc

        return gc.get_freeze_count()

    def cores(self) -> list[int]:
        import os

        return sorted(os.sched_getaffinity(0))


def test_groups_start_side_by_side(cluster, tmp_path) -> None:
    groups = launch_groups(cluster, {"a": "launch-a", "b": "launch-b"}, {"a": "0-1", "b": "2"},
                           {"a": GroupSpec(Echo, ("a",)), "b": GroupSpec(Echo, ("b",))}, tmp_path)
    try:
        assert groups["a"].who().wait() == ["a0", "a1"]
        assert groups["b"].who().wait() == ["b0"]
    finally:
        for g in groups.values():
            g.shutdown()


def test_what_a_worker_built_is_out_of_the_garbage_collectors_sight(cluster, tmp_path) -> None:
    # A full collection walks every object it sees: with the worker's start-up objects frozen, the one that
    # comes due in the middle of training does not stall a step.
    groups = launch_groups(cluster, {"h": "launch-frozen"}, {"h": "0"}, {"h": GroupSpec(Holder)}, tmp_path)
    try:
        (frozen,) = groups["h"].frozen().wait()
        assert frozen >= 10_000
    finally:
        groups["h"].shutdown()


def test_pinned_ranks_keep_to_the_cores_of_their_device_slots(cluster, tmp_path) -> None:
    import copy
    import os
    from dataclasses import replace

    allowed = sorted(os.sched_getaffinity(0))
    pinned = copy.copy(cluster)
    pinned.config = replace(cluster.config, pin_cpus=True)
    group = launch_groups(pinned, {"p": "launch-pinned"}, {"p": "0-1"}, {"p": GroupSpec(Holder)}, tmp_path)["p"]
    try:
        assert group.cores().wait() == [[allowed[0]], [allowed[1 % len(allowed)]]]
    finally:
        group.shutdown()
    free = launch_groups(cluster, {"q": "launch-free"}, {"q": "1"}, {"q": GroupSpec(Holder)}, tmp_path)["q"]
    try:
        assert free.cores().wait() == [allowed]  # off by default: the OS places the process
    finally:
        free.shutdown()


def test_a_failing_group_shuts_the_others_down(cluster, tmp_path, monkeypatch) -> None:
    from m2flow.runtime.executors import ray as launch_mod

    started, shut = [], []
    real = launch_mod.WorkerGroup

    def tracking(*args, **kwargs):
        group = real(*args, **kwargs)
        started.append(group)
        real_shutdown = group.shutdown

        def shutdown() -> None:
            shut.append(group)
            real_shutdown()

        group.shutdown = shutdown
        return group

    monkeypatch.setattr(launch_mod, "WorkerGroup", tracking)
    with pytest.raises((WorkerError, ValueError), match="cannot build"):
        launch_groups(cluster, {"ok": "launch-ok", "bad": "launch-bad"}, {"ok": "0", "bad": "1"},
                      {"ok": GroupSpec(Echo, ("x",)), "bad": GroupSpec(Broken)}, tmp_path)
    assert len(started) == 1 and shut == started  # the group that started was shut down
