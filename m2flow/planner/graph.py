"""A workflow's graph: its components and the typed data edges between them, declared as data.

The graph is the same for every placement: which components run in which processes, which edges
become channels and which stay inside a process, is the plan's business (``plan.py``). The
planner reads the graph; ``m2flow plan show`` prints it beside the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

DRIVER = "driver"
"""The pseudo-component of the process that runs the macro loop (it feeds prompts, reads metrics)."""


@dataclass(frozen=True)
class Component:
    """One component of a workflow: a worker group in the plan, unless fused into another."""

    name: str
    job: str
    """what it does, in a line"""
    holds_model: bool = False
    """holds a model copy on its devices (so it takes turns with other holders on shared devices)"""
    optional: bool = False
    """runs only when the config needs what it produces"""
    trains: bool = False
    """holds the trained state (weights, gradients, optimizer): its memory and offload are the whole
    training state, the other holders' only the weights"""
    worker: str = ""
    """the worker class that runs it, as ``module:Class`` (imported only when a group launches)"""
    section: str = ""
    """its config section (``rollout``, ``env_worker``); its settings live there"""
    threads_key: str = ""
    """the config key of its torch threads per rank (default ``<section>.num_threads``)"""
    timing: str = ""
    """the iteration metric that holds its busy seconds (the slowest rank's)"""
    cpu_timing: str = ""
    """the iteration metric that holds the part of those busy seconds its threads wanted a core (computing or
    runnable), per rank; "" when it computes all its busy time (``ComponentCost.cpu_share`` 1)"""
    rank_groups: bool = False
    """each rank is a group of one rank of its own, so one that dies or hangs is launched again alone while
    the others keep their processes (the agentic env workers)"""

    @property
    def threads_setting(self) -> str:
        """The config key of its threads, or "" when it has no section."""
        return self.threads_key or (f"{self.section}.num_threads" if self.section else "")


@dataclass(frozen=True)
class Edge:
    """Data flowing from one component to another."""

    name: str
    source: str
    target: str
    payload: str
    """the message type travelling on the edge"""
    kind: str = "stream"
    """``stream``: items routed to consumer ranks over a channel; ``p2p``: point-to-point messages
    between paired ranks; ``weights``: a weight sync"""


@dataclass(frozen=True)
class Fusion:
    """``component`` may run inside ``host``'s processes (an edge fewer, no second process)."""

    component: str
    host: str
    condition: str
    """when the plan takes it, in a line"""
    key: str = ""
    """the boolean config key that asks for it (``reward.fuse_with_rollout``)"""


@dataclass(frozen=True)
class WorkflowGraph:
    """The components, edges and possible fusions of one workflow."""

    name: str
    components: tuple[Component, ...]
    edges: tuple[Edge, ...]
    fusions: tuple[Fusion, ...] = ()

    def __post_init__(self) -> None:
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError(f"graph {self.name!r}: duplicate component names in {names}")
        known = set(names) | {DRIVER}
        for e in self.edges:
            for end in (e.source, e.target):
                if end not in known:
                    raise ValueError(f"graph {self.name!r}: edge {e.name!r} names unknown component {end!r}")
        edge_names = [e.name for e in self.edges]
        if len(set(edge_names)) != len(edge_names):
            raise ValueError(f"graph {self.name!r}: duplicate edge names in {edge_names}")
        for f in self.fusions:
            if f.component not in names or f.host not in names:
                raise ValueError(f"graph {self.name!r}: fusion {f.component!r} -> {f.host!r} names an unknown component")

    @property
    def component_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(f"graph {self.name!r} has no component {name!r}; it has {list(self.component_names)}")

    def edge(self, name: str) -> Edge:
        for e in self.edges:
            if e.name == name:
                return e
        raise KeyError(f"graph {self.name!r} has no edge {name!r}; it has {[e.name for e in self.edges]}")

    def fusion_closure(self) -> set[tuple[str, str]]:
        """Every (component, host) pair reachable by fusions: reward into rollout into actor puts reward in actor."""
        pairs = {(f.component, f.host) for f in self.fusions}
        while True:
            more = {(a, d) for a, b in pairs for c, d in pairs if b == c} - pairs
            if not more:
                return pairs
            pairs |= more

    def fusion(self, component: str, host: str) -> Fusion:
        for f in self.fusions:
            if (f.component, f.host) == (component, host):
                return f
        raise KeyError(f"graph {self.name!r} allows no fusion of {component!r} into {host!r}")

    def timings(self) -> dict[str, str]:
        """component -> the metric holding its busy seconds, for the components that declare one."""
        return {c.name: c.timing for c in self.components if c.timing}

    def cpu_timings(self) -> dict[str, str]:
        """component -> the metric holding the CPU part of its busy seconds, for the components that declare one."""
        return {c.name: c.cpu_timing for c in self.components if c.cpu_timing}

    def thread_keys(self) -> dict[str, str]:
        """component -> the config key of its threads, for the components that declare one."""
        return {c.name: c.threads_setting for c in self.components if c.threads_setting}

    def fusion_keys(self) -> dict[tuple[str, str], str]:
        """(component, host) -> the config key that asks for the fusion."""
        return {(f.component, f.host): f.key for f in self.fusions if f.key}

    def table(self) -> str:
        """The graph as text: components with their jobs, then edges with their payloads."""
        width = max(len(c.name) for c in self.components)
        lines = [f"workflow {self.name}: components"]
        for c in self.components:
            flags = ", ".join(f for f, on in (("holds a model", c.holds_model), ("trains", c.trains),
                                              ("optional", c.optional)) if on)
            lines.append(f"  {c.name:<{width}}  {c.job}" + (f" ({flags})" if flags else ""))
        lines.append("edges")
        ew = max(len(e.name) for e in self.edges) if self.edges else 0
        width = max(width, len(DRIVER))
        for e in self.edges:
            lines.append(f"  {e.name:<{ew}}  {e.source:>{width}} -> {e.target:<{width}}  {e.payload} ({e.kind})")
        if self.fusions:
            lines.append("possible fusions")
            for f in self.fusions:
                lines.append(f"  {f.component} into {f.host}: {f.condition}")
        return "\n".join(lines)
