"""What an executor is: the thing that applies a plan's placements by starting worker groups.

A workflow describes its groups as ``GroupSpec``s and hands them, with their resolved placements,
to an executor. The Ray executor (``ray.py``) starts one process per rank on the cluster; the local
executor runs the same worker classes as objects in the driver process. The workflow code, the
worker code and the loop are the same for both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from m2flow.runtime.placement import NodeLayout, PlacementPlan


@dataclass
class GroupSpec:
    """How to start one component's group: the worker class, its constructor arguments, its threads."""

    cls: type
    """the ``Worker`` subclass every rank instantiates"""
    args: tuple = ()
    """positional constructor arguments (the same for every rank)"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword constructor arguments (the same for every rank)"""
    threads: int = 1
    """torch threads per rank process"""


@runtime_checkable
class Handle(Protocol):
    """The pending results of one method called on some ranks of a group (``GroupHandle`` on Ray,
    ``LocalHandle`` in process): ``.wait()`` or ``await``, results in rank order, the first failure raised."""

    ranks: list[int]
    method: str

    def done(self) -> bool:
        """True when every called rank has finished (successfully or not)."""
        ...

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every called rank finishes; results in rank order."""
        ...

    def describe(self, rank: int) -> tuple[str, int, str]:
        """(group, rank, node) of a called rank, for error messages."""
        ...

    def __await__(self) -> Any:
        ...


@runtime_checkable
class WorkerGroup(Protocol):
    """N ranks of one worker class (``runtime.group.WorkerGroup`` on Ray, ``LocalGroup`` in process).

    ``group.method(*args, ranks=None)`` is sugar for ``execute("method", ...)``."""

    name: str

    @property
    def world_size(self) -> int:
        ...

    def execute(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> Handle:
        """Call ``method`` on every rank (or ``ranks``) with the same arguments."""
        ...

    def execute_each(self, method: str, per_rank_args: Sequence[Sequence[Any]],
                     ranks: Sequence[int] | None = None) -> Handle:
        """Call ``method`` on each rank with its own arguments."""
        ...

    def pids(self) -> list[int]:
        ...

    def shutdown(self) -> None:
        """Stop every rank."""
        ...


class Executor(Protocol):
    """Starts groups under resolved placements and stops what it started."""

    kind: str
    """``"ray"`` or ``"local"``"""

    @property
    def layout(self) -> NodeLayout:
        """Nodes and devices placements are resolved against."""
        ...

    def placement(self, spec: str | Mapping[str, str], components: Sequence[str] | None = None) -> PlacementPlan:
        """Resolve a placement string against this executor's nodes and devices."""
        ...

    def launch(self, names: Mapping[str, str], placements: PlacementPlan | Mapping[str, Any],
               specs: Mapping[str, GroupSpec], log_dir: Path, trace_dir: Path | None = None) -> dict[str, WorkerGroup]:
        """Start one group per entry of ``specs`` (all or none); the groups, by component."""
        ...

    def shutdown(self) -> None:
        """Release what this executor started (a Ray it started itself, in-process hosts)."""
        ...
