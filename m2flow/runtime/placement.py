"""Component placement: parse placement strings into device sets per rank and detect the execution mode.

Pure and fast: nothing here touches Ray. A placement maps component names to devices, in the form
users of RLinf know::

    "actor,rollout: 0-3, env: 4-7"     # actor and rollout share devices 0-3; env on 4-7
    "all"                              # every component on every device (collocated)
    "local"                            # every component on device 0, one rank each (selects the
                                       # local executor: see ``executors.make_executor``)
    "env: 0-1:0-3"                     # devices 0-1 hosting env ranks 0-3 (two processes per device)
    "actor: 0-3:0-1"                   # ranks 0-1 hold two devices each
    "env: 0-3@sim"                     # devices 0-3 of the node group named "sim"

Devices are numbered globally across the nodes of a node group: node 0's devices first, then node 1's.
A device item is ``DEVICES[:RANKS]``; several items of one component are separated by commas
(``"env: 0-1:0-3, 4-5:4-7"``). Without an explicit rank range each device gets one rank, numbered on
from the previous item.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from m2flow.errors import UserInputError

ExecutionMode = Literal["collocated", "disaggregated", "hybrid"]

LOCAL = "local"
"""The placement that runs every component, one rank each, on device 0 in the driver process."""


def executor_kind(placement: str) -> str:
    """``local`` (the in-process executor) for the ``local`` placement, else ``ray``."""
    return "local" if placement.strip() == LOCAL else "ray"

_NAMES_RE = re.compile(r"(?:^|,)\s*([A-Za-z_][\w-]*(?:\s*,\s*[A-Za-z_][\w-]*)*)\s*:")
_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


class PlacementError(UserInputError):
    """A placement string or mapping that cannot be satisfied."""


@dataclass(frozen=True)
class NodeLayout:
    """How many devices each node has, and which nodes form each named node group."""

    devices_per_node: tuple[int, ...]
    node_groups: Mapping[str, tuple[int, ...]] | None = None

    def group_nodes(self, group: str | None) -> tuple[int, ...]:
        """Node ranks of a node group (all nodes when ``group`` is None)."""
        if group is None:
            return tuple(range(len(self.devices_per_node)))
        groups = dict(self.node_groups or {})
        if group not in groups:
            raise PlacementError(f"unknown node group {group!r}; known: {sorted(groups) or 'none'}")
        return tuple(groups[group])

    def device_table(self, group: str | None) -> DeviceTable:
        """Global device index (within the group) -> (node_rank, local device index)."""
        for node in self.group_nodes(group):
            if not 0 <= node < len(self.devices_per_node):
                raise PlacementError(
                    f"node group {group!r} names node {node}, but the cluster has "
                    f"{len(self.devices_per_node)} node(s)"
                )
        return DeviceTable(tuple((node, self.devices_per_node[node]) for node in self.group_nodes(group)))


SYNTAX_LAYOUT_DEVICES = 1 << 16
"""Devices of the one-node layout used to check a placement's syntax when the cluster is not known yet."""


@dataclass(frozen=True)
class DeviceTable:
    """Lazy index over a group's devices: an unbounded layout (syntax checks) costs no memory."""

    nodes: tuple[tuple[int, int], ...]  # (node_rank, device count), in group order

    def __len__(self) -> int:
        return sum(count for _, count in self.nodes)

    @functools.cached_property
    def _starts(self) -> list[int]:
        """The group index of each node's first device (a table of thousands of devices is indexed by
        bisection, not by walking the nodes)."""
        return list(itertools.accumulate((count for _, count in self.nodes), initial=0))[:-1]

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index < 0:
            raise IndexError(index)
        i = bisect.bisect_right(self._starts, index) - 1
        # Skip nodes of no devices (they share their start with the next node).
        while i < len(self.nodes) and index - self._starts[i] >= self.nodes[i][1]:
            i += 1
        if i >= len(self.nodes):
            raise IndexError(index)
        return self.nodes[i][0], index - self._starts[i]


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank of a component runs."""

    rank: int
    node_rank: int
    local_devices: tuple[int, ...]
    global_devices: tuple[int, ...]
    node_group: str | None = None


@dataclass(frozen=True)
class ComponentPlacement:
    """All ranks of one component, in rank order."""

    component: str
    ranks: tuple[RankPlacement, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def devices(self) -> frozenset[tuple[int, int]]:
        """The (node_rank, local_device) pairs this component occupies."""
        return frozenset((r.node_rank, d) for r in self.ranks for d in r.local_devices)

    def same_devices(self, other: ComponentPlacement) -> bool:
        """Rank by rank, the two components sit on the same devices of the same nodes."""
        return self.world_size == other.world_size and all(
            (x.node_rank, x.local_devices) == (y.node_rank, y.local_devices) for x, y in zip(self.ranks, other.ranks))


@dataclass(frozen=True)
class PlacementPlan:
    """The placement of every component, and the execution mode it implies."""

    components: Mapping[str, ComponentPlacement]
    mode: ExecutionMode

    def __getitem__(self, component: str) -> ComponentPlacement:
        if component not in self.components:
            raise PlacementError(
                f"component {component!r} has no placement; placed: {sorted(self.components)}"
            )
        return self.components[component]


def _parse_range(text: str, what: str) -> list[int]:
    match = _RANGE_RE.match(text)
    if not match:
        raise PlacementError(f"bad {what} range {text.strip()!r}: expected N or N-M")
    lo = int(match.group(1))
    hi = int(match.group(2)) if match.group(2) is not None else lo
    if hi < lo:
        raise PlacementError(f"bad {what} range {text.strip()!r}: end {hi} is below start {lo}")
    return list(range(lo, hi + 1))


def split_spec(spec: str) -> dict[str, str]:
    """Split ``"a,b: 0-3, c: 4-7"`` into ``{"a,b": "0-3", "c": "4-7"}`` (``"all"`` alone is kept;
    ``"local"`` is every component on device 0)."""
    text = spec.strip()
    if not text:
        raise PlacementError("empty placement string")
    if text == "all" or text.startswith("all@"):
        return {"*": text}
    if text == LOCAL:
        return {"*": "0"}
    if text == "auto":  # resolved above the runtime, by the planner, before anything is placed
        raise PlacementError("placement 'auto' is chosen by the planner before a run starts; "
                             "the runtime places concrete placements only")
    matches = list(_NAMES_RE.finditer(text))
    if not matches or matches[0].start() != 0:
        raise PlacementError(
            f"cannot read placement {spec!r}: expected 'component[,component]: devices, ...' or 'all'"
        )
    entries: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        names = ",".join(n.strip() for n in m.group(1).split(","))
        body = text[m.end() : end].strip().rstrip(",").strip()
        if names in entries:
            raise PlacementError(f"components {names!r} are listed twice in {spec!r}")
        entries[names] = body
    return entries


def _component_ranks(
    component: str, body: str, layout: NodeLayout
) -> tuple[RankPlacement, ...]:
    body = body.strip()
    if not body:
        raise PlacementError(f"component {component!r} has an empty device list")
    group = None
    if "@" in body:
        body, group = (s.strip() for s in body.rsplit("@", 1))
    table = layout.device_table(group)
    where = f" of node group {group!r}" if group else ""
    if not table:
        raise PlacementError(f"component {component!r}: no devices{where}")
    items = [f"0-{len(table) - 1}"] if body == "all" else [s for s in body.split(",")]
    by_rank: dict[int, tuple[int, ...]] = {}
    next_rank = 0
    for item in items:
        if not item.strip():
            raise PlacementError(f"component {component!r}: empty item in {body!r}")
        dev_text, _, rank_text = item.partition(":")
        devices = _parse_range(dev_text, "device")
        if devices[-1] >= len(table):
            raise PlacementError(
                f"component {component!r} asks for device {devices[-1]}, but only devices "
                f"0-{len(table) - 1} exist{where} ({len(table)} in all)"
            )
        ranks = _parse_range(rank_text, "rank") if rank_text else list(
            range(next_rank, next_rank + len(devices))
        )
        next_rank = ranks[-1] + 1
        if len(ranks) >= len(devices):
            if len(ranks) % len(devices):
                raise PlacementError(
                    f"component {component!r}: {len(ranks)} ranks cannot be spread evenly over "
                    f"{len(devices)} devices in {item.strip()!r}"
                )
            per = len(ranks) // len(devices)
            assignment = {r: (devices[i // per],) for i, r in enumerate(ranks)}
        else:
            if len(devices) % len(ranks):
                raise PlacementError(
                    f"component {component!r}: {len(devices)} devices cannot be split evenly over "
                    f"{len(ranks)} ranks in {item.strip()!r}"
                )
            per = len(devices) // len(ranks)
            assignment = {r: tuple(devices[i * per : (i + 1) * per]) for i, r in enumerate(ranks)}
        for r, devs in assignment.items():
            if r in by_rank:
                raise PlacementError(f"component {component!r}: rank {r} is placed twice")
            by_rank[r] = devs
    expected = list(range(len(by_rank)))
    if sorted(by_rank) != expected:
        raise PlacementError(
            f"component {component!r}: ranks must be 0..{len(by_rank) - 1} without gaps, "
            f"got {sorted(by_rank)}"
        )
    placed = []
    for r in expected:
        devs = by_rank[r]
        nodes = {table[d][0] for d in devs}
        if len(nodes) != 1:
            raise PlacementError(
                f"component {component!r}: rank {r} would span nodes {sorted(nodes)}; "
                "a rank's devices must be on one node"
            )
        placed.append(
            RankPlacement(
                rank=r,
                node_rank=nodes.pop(),
                local_devices=tuple(table[d][1] for d in devs),
                global_devices=devs,
                node_group=group,
            )
        )
    return tuple(placed)


def detect_mode(components: Mapping[str, ComponentPlacement]) -> ExecutionMode:
    """Collocated when all share one device set, disaggregated when all are disjoint, else hybrid."""
    sets = [c.devices for c in components.values()]
    if len(sets) <= 1 or all(s == sets[0] for s in sets):
        return "collocated"
    if all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1 :]):
        return "disaggregated"
    return "hybrid"


def _check_overlaps(components: Mapping[str, ComponentPlacement]) -> None:
    """Two components must share all, none, or a nested subset of their devices."""
    items = list(components.items())
    for i, (a, pa) in enumerate(items):
        for b, pb in items[i + 1 :]:
            sa, sb = pa.devices, pb.devices
            if sa.isdisjoint(sb) or sa <= sb or sb <= sa:
                continue
            shared = sorted(sa & sb)
            raise PlacementError(
                f"components {a!r} and {b!r} partly overlap on (node, device) {shared}: "
                "components must share all of their devices, none, or one's devices must "
                "contain the other's"
            )


def parse_placement(
    spec: str | Mapping[str, str],
    layout: NodeLayout,
    components: Sequence[str] | None = None,
) -> PlacementPlan:
    """Resolve a placement string or mapping into per-rank devices for every component.

    ``components`` lists the components the workflow needs: ``"all"`` expands to them, and a
    placement that misses one or names an unknown one fails.
    """
    entries = split_spec(spec) if isinstance(spec, str) else {
        ",".join(n.strip() for n in str(k).split(",")): str(v) for k, v in spec.items()
    }
    if not entries:
        raise PlacementError("empty placement")
    resolved: dict[str, ComponentPlacement] = {}
    for names, body in entries.items():
        if names == "*":
            if not components:
                raise PlacementError(f"placement {spec!r} needs the list of components to place")
            group_names = list(components)
        else:
            group_names = [n for n in names.split(",") if n]
        for name in group_names:
            if name in resolved:
                raise PlacementError(f"component {name!r} is placed twice")
            resolved[name] = ComponentPlacement(name, _component_ranks(name, body, layout))
    if components is not None:
        unknown = sorted(set(resolved) - set(components))
        if unknown:
            raise PlacementError(
                f"placement names unknown component(s) {unknown}; this workflow has {sorted(components)}"
            )
        missing = sorted(set(components) - set(resolved))
        if missing:
            raise PlacementError(f"placement misses component(s) {missing}")
    _check_overlaps(resolved)
    return PlacementPlan(components=resolved, mode=detect_mode(resolved))
