"""Hosting: one component running inside another component's processes (a fusion), the one way it is done.

A host worker is constructed with ``hosted``: the hosted components' settings, by name. Each settings
object is ``Hostable``: it builds the component's in-process part inside the host (``hosted_in``), with
the host's rank, devices and comm at hand. The host uses that part directly (a function call, no
message), and callers outside reach it as ``"<component>/<method>"`` on the host's group
(``HostedGroup`` does that for them), so a flow calls a component the same way fused or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from m2flow.runtime.executors.base import Handle, WorkerGroup

SEPARATOR = "/"
"""Between a hosted component's name and its method, in a method name called on the host's group."""


class Hostable(Protocol):
    """The settings of a component that can run inside another component's processes."""

    def hosted_in(self, host: Any) -> Any:
        """The component's in-process part, built inside ``host`` (a ``Worker``, which may be asked for its
        other hosted parts)."""
        ...


def split_method(method: str) -> tuple[str, str]:
    """``"rollout/generate"`` -> ("rollout", "generate"); a plain method -> ("", method)."""
    component, _, name = method.rpartition(SEPARATOR)
    return component, name


class HostedGroup:
    """Calls to a component that runs inside another group's processes: ``view.generate(step)`` calls
    ``generate`` of the part hosted on each rank of the host group. It has the ``WorkerGroup`` calls a
    flow makes (``execute``, ``execute_each``, attribute sugar, ``world_size``, ``name``)."""

    def __init__(self, host: WorkerGroup, component: str) -> None:
        self.host = host
        self.component = component
        self.name = host.name

    @property
    def world_size(self) -> int:
        return self.host.world_size

    def execute(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> Handle:
        return self.host.execute(f"{self.component}{SEPARATOR}{method}", *args, ranks=ranks, **kwargs)

    def execute_each(self, method: str, per_rank_args: Sequence[Sequence[Any]],
                     ranks: Sequence[int] | None = None) -> Handle:
        return self.host.execute_each(f"{self.component}{SEPARATOR}{method}", per_rank_args, ranks=ranks)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> Handle:
            return self.execute(method, *args, ranks=ranks, **kwargs)

        return call

    def shutdown(self) -> None:
        """Nothing of its own to stop: the host group's shutdown stops it."""

    def __repr__(self) -> str:
        return f"HostedGroup({self.component!r} in {self.name!r})"
