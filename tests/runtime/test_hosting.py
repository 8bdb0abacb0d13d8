"""Hosting: a component's in-process part built inside a host worker from its settings, called from
outside as ``component/method`` on the host's group, the way its own group would be called."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from m2flow.runtime import Worker
from m2flow.runtime.errors import WorkerError
from m2flow.runtime.executors import GroupSpec, LocalExecutor
from m2flow.runtime.hosting import HostedGroup, split_method
from m2flow.runtime.trace import trace_category


@dataclass(frozen=True)
class CounterSettings:
    start: int

    def hosted_in(self, host: Worker) -> Counter:
        return Counter(self.start + 1000 * host.rank)


@dataclass(frozen=True)
class ScaledSettings:
    """A hosted part that uses another hosted part of the same host (built first, on demand)."""

    factor: int

    def hosted_in(self, host: Worker) -> Scaled:
        return Scaled(host.hosted("counter"), self.factor)


class Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    @trace_category("count")
    def bump(self, by: int = 1) -> int:
        self.value += by
        return self.value


class Scaled:
    def __init__(self, counter: Counter, factor: int) -> None:
        self.counter, self.factor = counter, factor

    def read(self) -> int:
        return self.counter.value * self.factor


class Host(Worker):
    def __init__(self, *, settings: None = None, hosted: dict[str, Any] | None = None) -> None:
        self.host_components(hosted)

    def own(self) -> str:
        return "host"


def test_split_method() -> None:
    assert split_method("rollout/generate") == ("rollout", "generate")
    assert split_method("train") == ("", "train")


def test_hosted_parts_are_built_in_the_host_and_called_through_its_group(tmp_path) -> None:
    ex = LocalExecutor()
    try:
        # "scaled" comes first and needs "counter": the host builds it on demand.
        hosted = {"scaled": ScaledSettings(3), "counter": CounterSettings(5)}
        plan = ex.placement("host: 0-1", components=["host"])
        group = ex.launch({"host": "hosting-test"}, plan, {"host": GroupSpec(Host, (), {"hosted": hosted})},
                          tmp_path / "logs")["host"]
        counter, scaled = HostedGroup(group, "counter"), HostedGroup(group, "scaled")
        assert counter.world_size == 2 and counter.name == group.name
        assert counter.bump(2).wait(10) == [7, 1007]  # each rank's own part, built with its rank
        assert counter.execute_each("bump", [(1,), (10,)]).wait(10) == [8, 1017]
        assert scaled.read(ranks=[1]).wait(10) == [3051]
        assert group.own().wait(10) == ["host", "host"]  # the host's own methods as before
        with pytest.raises(WorkerError, match="hosts no component 'nothing'"):
            HostedGroup(group, "nothing").bump().wait(10)
    finally:
        ex.shutdown()


def test_a_worker_that_hosts_nothing_answers_none() -> None:
    w = Host.__new__(Host)
    assert w.hosted("counter") is None and w.hosted_parts() == []
    w.host_components(None)
    assert w.hosted("counter") is None
