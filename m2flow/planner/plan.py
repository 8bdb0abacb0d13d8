"""The Plan: every execution decision of one run, made in one place, validated once, applied by an executor.

The one builder (``build.build_plan``) makes it from the workflow graph, a ``PlanChoice`` (what the
config asks for, or the search's candidate), the constraints the workflow's config adds and the
cluster's layout: devices per component and rank, which components run and which are fused into another's
processes, what each edge becomes (a channel, point-to-point messages, or a hand-over inside one
process), who takes turns on shared devices and offloads, pipeline stages and micro-batch sizes.
It prints as a table (``m2flow plan show``), saves as JSON into the run directory and loads back
equal.
"""

from __future__ import annotations

from m2flow.errors import UserInputError

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from m2flow.planner.graph import DRIVER, WorkflowGraph
from m2flow.runtime.placement import ComponentPlacement, PlacementPlan, RankPlacement, detect_mode

Transport = Literal["channel", "p2p", "in-process", "unused"]
PLAN_FILE = "plan.json"
_FORMAT = 1


class PlanError(UserInputError):
    """A plan that cannot be applied (or a plan file that cannot be read)."""


def fusion_refusal(component: ComponentPlacement, host: ComponentPlacement, name: str, host_name: str) -> str:
    """Why ``name`` cannot run inside ``host_name``'s processes on these placements ("" when it can): it
    must sit on the host's devices rank for rank, so that each of its ranks has a host rank to run in. The
    one rule, for the builder that takes a fusion and for ``Plan.validate`` that checks one."""
    if component.same_devices(host):
        return ""
    return f"{name} runs as its own group: it is not on {host_name}'s devices rank for rank"


@dataclass(frozen=True)
class ComponentPlan:
    """One component's part of the plan."""

    name: str
    placement: ComponentPlacement
    """its devices, rank by rank"""
    host: str
    """the component whose processes run it: itself, or the one it is fused into"""
    active: bool = True
    """False: an optional component this config does not need"""
    shares_devices: bool = False
    """takes turns (the device lock) with another model holder on some of its devices"""
    offload: bool = False
    """moves its state to host memory while another component has the devices"""
    threads: int = 1
    """torch threads per rank"""

    @property
    def world_size(self) -> int:
        return self.placement.world_size

    @property
    def fused(self) -> bool:
        return self.host != self.name

    @property
    def launched(self) -> bool:
        """Whether the component is a worker group of its own."""
        return self.active and not self.fused


@dataclass(frozen=True)
class EdgePlan:
    """What one edge of the graph becomes under the plan."""

    name: str
    source: str
    """the group (after fusions) that sends, or ``driver``"""
    target: str
    """the group (after fusions) that receives"""
    transport: Transport
    consumers: int = 1
    """ranks of the receiving group"""


@dataclass(frozen=True)
class Plan:
    """Every execution decision of a run."""

    workflow: str
    executor: str
    """``ray`` or ``local``"""
    placement: str
    """the placement as the config wrote it"""
    components: tuple[ComponentPlan, ...]
    edges: tuple[EdgePlan, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    """workflow-level timing decisions (pipeline stages, micro-batch sizes), JSON values"""
    notes: tuple[str, ...] = ()
    """why a decision went the way it did (a fusion taken or not), one line each"""

    # -- lookups ---------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> ComponentPlan:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(f"the plan has no component {name!r}; it has {[c.name for c in self.components]}")

    @property
    def mode(self) -> str:
        """collocated, disaggregated or hybrid, from the devices of the components that run."""
        return detect_mode({c.name: c.placement for c in self.components if c.active})

    @property
    def launched(self) -> tuple[str, ...]:
        """Components that are worker groups of their own, in graph order."""
        return tuple(c.name for c in self.components if c.launched)

    def fused(self, name: str) -> bool:
        return self[name].fused

    def guests(self, host: str) -> tuple[str, ...]:
        """The active components fused into ``host``'s processes (its hosted components), in graph order."""
        return tuple(c.name for c in self.components if c.active and c.fused and c.host == host)

    def runs(self, name: str) -> bool:
        return self[name].active

    def placements(self) -> PlacementPlan:
        """The launched components' placements, as an executor takes them."""
        chosen = {c.name: c.placement for c in self.components if c.launched}
        return PlacementPlan(components=chosen, mode=detect_mode(chosen))

    def edge(self, name: str) -> EdgePlan:
        for e in self.edges:
            if e.name == name:
                return e
        raise KeyError(f"the plan has no edge {name!r}")

    # -- checks ----------------------------------------------------------------------------------
    def validate(self, graph: WorkflowGraph) -> Plan:
        """Check the plan against its graph; returns itself. Raises PlanError naming what is wrong."""
        if self.workflow != graph.name:
            raise PlanError(f"plan is for workflow {self.workflow!r}, the graph is {graph.name!r}")
        names = [c.name for c in self.components]
        if sorted(names) != sorted(graph.component_names):
            raise PlanError(f"plan components {sorted(names)} differ from the graph's {sorted(graph.component_names)}")
        if self.executor not in ("ray", "local"):
            raise PlanError(f"executor must be 'ray' or 'local', got {self.executor!r}")
        fusions = graph.fusion_closure()
        for c in self.components:
            if c.threads < 1:
                raise PlanError(f"{c.name}: threads must be >= 1, got {c.threads}")
            if c.fused and c.active:
                if (c.name, c.host) not in fusions:
                    raise PlanError(f"{c.name} cannot be fused into {c.host}: the graph allows no such fusion")
                host = self[c.host]
                if not host.launched:
                    raise PlanError(f"{c.name} is fused into {c.host}, which is not a group of its own")
                if fusion_refusal(c.placement, host.placement, c.name, c.host):
                    raise PlanError(f"{c.name} is fused into {c.host} but does not sit on its devices rank for rank")
            if not c.active and not graph.component(c.name).optional:
                raise PlanError(f"{c.name} is not optional in workflow {graph.name!r} and must run")
        groups = set(self.launched) | {DRIVER}
        for e in self.edges:
            graph.edge(e.name)
            if e.transport != "unused" and (e.source not in groups or e.target not in groups):
                raise PlanError(f"edge {e.name}: {e.source} -> {e.target} is not between running groups")
        if self.executor == "local":
            many = [c.name for c in self.components if c.launched and c.world_size > 1]
            if many:
                raise PlanError(f"the local executor runs one rank per component; {many} have more")
        return self

    # -- text ------------------------------------------------------------------------------------
    def table(self) -> str:
        """The plan as a table: a header line, one row per component, the edges, the settings, notes."""
        lines = [f"plan: workflow {self.workflow}, {self.mode}, executor {self.executor}, placement {self.placement!r}"]
        rows = [("component", "ranks", "devices (node:device per rank)", "runs in", "turns", "offload", "threads")]
        for c in self.components:
            devices = " ".join(f"{r.node_rank}:{','.join(map(str, r.local_devices))}" for r in c.placement.ranks)
            runs_in = "-" if not c.active else ("own group" if not c.fused else f"{c.host} (fused)")
            rows.append((c.name, str(c.world_size) if c.active else "-", devices if c.active else "(not needed)",
                         runs_in, *(("host's", "host's") if c.fused else
                                    ("yes" if c.shares_devices else "no", "yes" if c.offload else "no")),
                         str(c.threads)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        if self.edges:
            lines.append("  edges:")
            for e in self.edges:
                where = "" if e.transport == "unused" else f" -> {e.consumers} rank(s)"
                lines.append(f"    {e.name}: {e.source} -> {e.target}, {e.transport}{where}")
        if self.settings:
            lines.append("  settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()))
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"format": _FORMAT, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        """A plan from ``to_json``'s text; a malformed one raises PlanError naming ``source``."""
        try:
            data = json.loads(text)
            if data.pop("format", None) != _FORMAT:
                raise PlanError(f"{source}: not a plan file of format {_FORMAT}")
            comps = tuple(
                ComponentPlan(**{**c, "placement": ComponentPlacement(
                    c["placement"]["component"],
                    tuple(RankPlacement(r["rank"], r["node_rank"], tuple(r["local_devices"]),
                                        tuple(r["global_devices"]), r.get("node_group"))
                          for r in c["placement"]["ranks"]))})
                for c in data.pop("components"))
            edges = tuple(EdgePlan(**e) for e in data.pop("edges"))
            return cls(components=comps, edges=edges, notes=tuple(data.pop("notes")), **data)
        except PlanError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise PlanError(f"{source}: not a valid plan ({type(e).__name__}: {e})") from None

    def save(self, run_dir: Path) -> Path:
        path = Path(run_dir) / PLAN_FILE
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: Path) -> Plan:
        return cls.from_json(Path(path).read_text(), source=str(path))
