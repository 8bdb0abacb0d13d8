"""Launching a Plan, written once for every workflow: the streams, the groups, the views of fused components.

``launch_plan`` wires a run from the Plan alone (and the graph, for each component's worker class and
each edge's kind); a flow gets the result, ``Launched``, and only says what to call in what order:

- every data edge (a ``stream`` in the graph) the plan runs gets a ``GroupStream`` over a new channel,
  one consumer per rank of the receiving group, with one lane when the driver feeds it (one producer,
  in order) and ``max_staleness`` + 1 otherwise (several producer ranks, iterations in flight). Inside
  one process an edge into a group's own worker is a stream too, whose items stay in the process
  (``GroupStream.keep_local``); an edge into a hosted component gets none (its host hands the items
  over by a call), nor does a ``p2p`` edge (the groups' calls and comm carry it) or an ``unused`` one;
- every launched component gets its group, built with its settings and, through ``hosted=``, those of
  the components fused into it; every fused one a ``HostedGroup`` over its host's group, so a flow calls
  a component the same way wherever it runs;
- a component the graph marks ``rank_groups`` gets one group of one rank per rank (``RankGroups``), so
  one that dies or hangs is launched again alone (``RankGroups.restart``).

The settings depend on the wiring (a worker is given the streams it reads and the names of the groups it
talks to), so they may be given as a function of the ``Wiring``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from m2flow.planner import Plan, WorkflowGraph
from m2flow.planner.graph import DRIVER
from m2flow.planner.plan import EdgePlan
from m2flow.runtime.executors import Executor, GroupSpec, Handle, WorkerGroup
from m2flow.runtime.hosting import HostedGroup
from m2flow.runtime.placement import ComponentPlacement

if TYPE_CHECKING:
    from m2flow.runtime.streams import GroupStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wiring:
    """What the settings of a run's workers may name: the groups and the streams between them."""

    names: Mapping[str, str]
    """component -> the name of its group (of rank r's group, ``rank_name``, for a ``rank_groups`` one)"""
    streams: Mapping[str, GroupStream]
    """edge -> its stream, for the data edges that have one"""


Settings = Union[Mapping[str, Any], Callable[[Wiring], Mapping[str, Any]]]
"""One settings object per active component (None for a worker that takes none), or a function of the wiring
that gives them."""


def import_worker(path: str) -> type:
    """The worker class named ``module:Class``."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"a worker is named 'module:Class', got {path!r}")
    return getattr(importlib.import_module(module), name)


def group_spec(graph: WorkflowGraph, component: str, plan: Plan, settings: Any = None,
               hosted: Mapping[str, Any] | None = None) -> GroupSpec:
    """The ``GroupSpec`` of a launched component: its declared worker class, built with ``settings=`` (its
    settings object, keyword-only) and, when other components run in its processes, ``hosted=`` (their
    settings by name); the plan's threads."""
    kwargs: dict[str, Any] = {} if settings is None else {"settings": settings}
    if hosted:
        kwargs["hosted"] = dict(hosted)
    return GroupSpec(import_worker(graph.component(component).worker), (), kwargs, plan[component].threads)


def hosted_settings(graph: WorkflowGraph, host: str, plan: Plan, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of the components the plan fuses into ``host`` (from the graph's ``Fusion``s), by name."""
    missing = [g for g in plan.guests(host) if g not in settings]
    if missing:
        raise ValueError(f"{graph.name}: no settings for {missing}, which run inside {host!r}")
    return {g: settings[g] for g in plan.guests(host)}


def rank_name(component: str, rank: int, run_id: str, restart: int = 0) -> str:
    """The group name of rank ``rank`` of a ``rank_groups`` component (after its ``restart``-th restart)."""
    return f"{component}{rank}-{run_id}" + (f"-r{restart}" if restart else "")


class RankGroups:
    """A component launched as one group of one rank per rank: calls by rank, and a rank launched again alone."""

    def __init__(self, component: str, groups: Sequence[WorkerGroup],
                 relaunch: Callable[[int, int], WorkerGroup]) -> None:
        self.component = component
        self.groups = list(groups)
        self._relaunch = relaunch  # (rank, restarts so far) -> a new group of that rank
        self.restarts = 0
        """ranks launched again so far, all ranks together"""

    @property
    def world_size(self) -> int:
        return len(self.groups)

    def __getitem__(self, rank: int) -> WorkerGroup:
        return self.groups[rank]

    def execute(self, method: str, *args: Any, ranks: Sequence[int], **kwargs: Any) -> Handle:
        """Call ``method`` on one rank (``ranks=[r]``): each rank is a group of its own, with a handle of its own."""
        if len(ranks) != 1:
            raise ValueError(f"{self.component}: each rank is a group of its own; call one rank at a time, not {ranks}")
        return self.groups[ranks[0]].execute(method, *args, **kwargs)

    def pids(self) -> list[int]:
        return [g.pids()[0] for g in self.groups]

    def restart(self, rank: int) -> WorkerGroup:
        """Shut rank ``rank``'s group down (it may be gone already) and launch it again, alone."""
        self.restarts += 1
        try:
            self.groups[rank].shutdown()
        except Exception:  # noqa: BLE001 - it is gone already
            log.debug("%s rank %d: shutdown failed", self.component, rank, exc_info=True)
        self.groups[rank] = self._relaunch(rank, self.restarts)
        return self.groups[rank]

    def shutdown(self) -> None:
        for rank, g in enumerate(self.groups):
            try:
                g.shutdown()
            except Exception:  # noqa: BLE001 - a teardown: the other ranks still stop
                log.warning("%s rank %d: shutdown failed", self.component, rank, exc_info=True)


Group = Union[WorkerGroup, HostedGroup, RankGroups]


@dataclass
class Launched:
    """A launched Plan: a group (or a view of one) per active component, the group names, the streams."""

    plan: Plan
    names: Mapping[str, str]
    streams: Mapping[str, GroupStream]
    groups: Mapping[str, Group]
    """active component -> its group; a fused one's is a ``HostedGroup`` over its host's group"""

    def __getitem__(self, component: str) -> Group:
        return self.groups[component]

    def get(self, component: str) -> Group | None:
        """The component's group, or None when it does not run."""
        return self.groups.get(component)

    def abort(self) -> None:
        """End every stream at once (a wait on one ends): a frozen rank would never confirm its puts."""
        for stream in self.streams.values():
            stream.abort()

    def shutdown(self) -> None:
        """Close the streams, stop every group, then release the streams' hosts, so a process that runs many
        flows keeps no threads or actors of finished ones. A group that fails to stop (one gone already) does
        not keep the others running."""
        self.abort()
        for c in self.plan.launched:
            try:
                self.groups[c].shutdown()
            except Exception:  # noqa: BLE001 - a teardown, often after a worker died: stop the rest
                log.warning("group %s: shutdown failed", c, exc_info=True)
        for stream in self.streams.values():
            try:
                stream.destroy()
            except Exception:  # noqa: BLE001 - nothing is left to save; a host already gone is fine
                log.debug("stream %s: releasing its host failed", stream.name, exc_info=True)

    def describe(self) -> str:
        """What runs where, in one line: the placement mode, each group and its ranks, the fusions."""
        plan = self.plan
        fused = [f"{c} in {plan[c].host}" for c in self.groups if plan[c].fused]
        return (f"launched {plan.mode}: {', '.join(f'{c} x{plan[c].world_size}' for c in plan.launched)}"
                + (f" (fused: {', '.join(fused)})" if fused else ""))


def stream_lanes(plan: Plan, edge: EdgePlan) -> int:
    """Lanes of an edge's stream: one when the driver feeds it (one producer, in order), else one per iteration
    that may be in flight (``max_staleness`` + 1), so a consumer never takes a faster rank's next iteration."""
    return 1 if edge.source == DRIVER else int(plan.settings.get("max_staleness", 0)) + 1


def has_stream(graph: WorkflowGraph, plan: Plan, edge: EdgePlan) -> bool:
    """Whether ``edge`` runs as a stream: a data edge the plan runs, unless its receiver is hosted in the
    sender's process (the host hands it the items by a call)."""
    declared = graph.edge(edge.name)
    if declared.kind != "stream" or edge.transport in ("unused", "p2p"):
        return False
    receiver = declared.target
    return not (edge.transport == "in-process" and receiver != DRIVER and plan[receiver].active
                and plan[receiver].fused)


def _one_rank(plan: Plan, component: str, rank: int) -> ComponentPlacement:
    """Rank ``rank`` of ``component`` as a group of one rank."""
    return ComponentPlacement(component, (replace(plan[component].placement.ranks[rank], rank=0),))


def _requests(graph: WorkflowGraph, plan: Plan, run_id: str,
              given: Mapping[str, Any]) -> dict[str, tuple[str, ComponentPlacement, GroupSpec]]:
    """key -> (group name, placement, spec) of every group to start: a launched component's under its name, rank
    r of a ``rank_groups`` one under ``component/r``. Those come last, as they always have: a local executor
    builds groups in this order, and a constructor may draw from torch's global generator."""
    out = {c: (f"{c}-{run_id}", plan[c].placement, group_spec(graph, c, plan, given[c],
                                                               hosted_settings(graph, c, plan, given)))
           for c in plan.launched if not graph.component(c).rank_groups}
    for c in plan.launched:
        if graph.component(c).rank_groups:
            if plan.guests(c):
                raise ValueError(f"{graph.name}: {c} runs one group per rank and cannot host {list(plan.guests(c))}")
            out.update({f"{c}/{r}": (rank_name(c, r, run_id), _one_rank(plan, c, r), group_spec(graph, c, plan, given[c]))
                        for r in range(plan[c].world_size)})
    return out


def launch_plan(graph: WorkflowGraph, plan: Plan, executor: Executor, run_id: str, log_dir: Path,
                trace_dir: Path | None, settings: Settings) -> Launched:
    """Start ``plan``: its streams, then every launched group through ``executor`` (all or none; on a failure
    the streams are released too). ``settings``: see ``Settings``."""
    from m2flow.runtime.streams import GroupStream

    names = {c: f"{c}-{run_id}" for c in graph.component_names}
    streams: dict[str, GroupStream] = {}
    try:
        for e in plan.edges:
            if has_stream(graph, plan, e):
                streams[e.name] = GroupStream.create(f"{e.name}-{run_id}", e.consumers, stream_lanes(plan, e))
        given = settings if isinstance(settings, Mapping) else settings(Wiring(names, streams))
        missing = sorted({c.name for c in plan.components if c.active} - set(given))
        if missing:
            raise ValueError(f"{graph.name}: no settings for component(s) {missing}")
        requests = _requests(graph, plan, run_id, given)
        started = executor.launch({k: r[0] for k, r in requests.items()}, {k: r[1] for k, r in requests.items()},
                                  {k: r[2] for k, r in requests.items()}, log_dir, trace_dir)
    except BaseException:
        for stream in streams.values():
            try:
                stream.destroy()
            except Exception:  # noqa: BLE001 - the launch's own error is the one to see
                log.debug("stream %s: releasing its host failed", stream.name, exc_info=True)
        raise

    def relaunch(c: str, r: int, restarts: int) -> WorkerGroup:
        key = f"{c}/{r}"
        return executor.launch({key: rank_name(c, r, run_id, restarts)}, {key: _one_rank(plan, c, r)},
                               {key: group_spec(graph, c, plan, given[c])}, log_dir, trace_dir)[key]

    groups: dict[str, Group] = {}
    for c in plan.launched:
        if not graph.component(c).rank_groups:
            groups[c] = started[c]
        else:
            groups[c] = RankGroups(c, [started[f"{c}/{r}"] for r in range(plan[c].world_size)],
                                   lambda r, n, c=c: relaunch(c, r, n))
    for fused in plan.components:
        if fused.active and fused.fused:
            groups[fused.name] = HostedGroup(groups[fused.host], fused.name)  # type: ignore[arg-type]
    launched = Launched(plan, names, streams, groups)
    log.info("%s", launched.describe())
    return launched
