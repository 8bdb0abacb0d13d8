"""What the simulator needs to know of a plan: the workload's shape and where each running component sits.

``Workload`` is declared once per workflow beside its graph: which components process every
micro-batch in order (the chain), which alternate in a loop before it (env and policy, split into
pipeline stages), and which plan settings give the items of an iteration and of a micro-batch.
``SimSetup`` is one plan as the simulator sees it: per running component its process group, ranks,
threads, and the device classes it takes turns on. It is built from a ``Plan`` (``setup_from_plan``)
or directly by the search for candidates it has not turned into Plans yet (``build_setup``), so
that scoring thousands of candidates on thousands of devices never builds a rank table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from m2flow.planner.graph import DRIVER, WorkflowGraph
from m2flow.planner.plan import Plan


@dataclass(frozen=True)
class Workload:
    """The shape of one iteration, in plan-settings terms."""

    chain: tuple[str, ...]
    """components that process every micro-batch, in dataflow order (inactive ones are skipped)"""
    items: tuple[str, ...]
    """plan settings whose product is the items of one iteration"""
    micro_items: tuple[str, ...] = ()
    """plan settings whose product is the items of one micro-batch of the chain (empty: the whole batch)"""
    items_per_rank_of: str = ""
    """when set, item counts are per rank of this component (envs per env rank) and scale with its ranks"""
    loop: tuple[str, str] | None = None
    """(env, policy): before the chain they alternate, policy first, ``loop_steps`` times per stage"""
    loop_steps: str = ""
    """plan setting: steps of the loop per iteration"""
    loop_items: tuple[str, ...] = ()
    """plan settings whose product is the items of one loop step, all stages together"""
    stages: str = ""
    """plan setting: pipeline stages the loop's items are split into (empty: one)"""
    inputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """graph edges a component receives on; one counts when its source runs and its target is the
    component or does not run, and costs a transfer when source and component are in different processes"""
    weights: tuple[tuple[str, str], ...] = ()
    """(source, target) weight syncs at the start of every iteration"""
    categories: Mapping[str, str] = field(default_factory=dict)
    """trace category of each component's work (``generate``, ``train``, ...)"""
    run_ahead: str = ""
    """plan setting: iterations the chain's work may start ahead of the training whose weights it uses
    (bounded staleness; empty or 0: each iteration waits for the last one's training)"""

    def components(self) -> tuple[str, ...]:
        return (tuple(self.loop) if self.loop else ()) + self.chain


@dataclass(frozen=True)
class Placed:
    """One running component as the simulator sees it."""

    name: str
    host: str
    """the process group it runs in (itself, or the component it is fused into)"""
    ranks: int
    """data-parallel ranks: the ``d`` of its cost curve"""
    threads: int = 1
    """torch threads of its process (a fused component runs on its host's)"""
    takes_turns: bool = False
    """takes the device lock of its devices (a model holder sharing devices with another)"""
    offload: bool = False
    classes: frozenset[int] = frozenset()
    """the device classes its ranks sit on"""
    node_ranks: tuple[tuple[int, int], ...] = ()
    """(node, ranks there), for CPU contention"""
    moves: tuple[str, ...] = ()
    """the components whose state its offload moves and whose memory takes turns: its own, when it holds
    a model, else the model holders fused into it (a policy inside the env processes); empty for a fused one"""
    weights_in_host: bool = False
    """a model holder fused into another holder: it uses the host's weights, so its own are not counted again
    (``ComponentCost.shared_bytes``)"""


@dataclass(frozen=True)
class DeviceClass:
    """Devices on which exactly the same components sit (they behave alike in the simulation)."""

    label: str
    """the devices, e.g. ``0:0-3`` (node 0, devices 0 to 3)"""
    count: int
    members: frozenset[str]
    ranks_per_device: Mapping[str, float] = field(default_factory=dict)
    """ranks of each member per device of the class (several ranks may share a device)"""
    devices: tuple[tuple[int, int], ...] = ()
    """its (node, device) pairs, when there are few enough to list (traces show them)"""


@dataclass(frozen=True)
class SimSetup:
    """A plan as the simulator plays it."""

    components: Mapping[str, Placed]
    classes: tuple[DeviceClass, ...]
    settings: Mapping[str, Any]
    in_driver: bool = False
    """every component runs in the driver process (the local executor): no call is a message to another
    process, no edge a transfer"""

    def setting(self, keys: Sequence[str]) -> float:
        try:
            return math.prod(float(self.settings[k]) for k in keys)
        except KeyError as e:
            raise KeyError(f"the plan has no setting {e.args[0]!r}; it has {sorted(self.settings)}") from None


_LISTED = 64
"""Devices a class lists at most (larger classes are known by label and count alone)."""


def _ranges(devices: Sequence[tuple[int, int]]) -> str:
    """``[(0, 0), (0, 1), (0, 2), (1, 5)]`` -> ``"0:0-2 1:5"``."""
    out: list[str] = []
    for node in sorted({n for n, _ in devices}):
        ids = sorted(d for n, d in devices if n == node)
        runs: list[list[int]] = [[ids[0], ids[0]]]
        for d in ids[1:]:
            if d == runs[-1][1] + 1:
                runs[-1][1] = d
            else:
                runs.append([d, d])
        out.append(f"{node}:" + ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs))
    return " ".join(out)


def state_owners(hosts: Mapping[str, str], holders: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Per process group (a component that is its own host): the components whose state its offload
    moves. A group that holds a model moves its own (a holder fused into it uses those weights); any
    other group moves the model holders fused into it (the policy copy inside the env processes)."""
    out = {}
    for g in sorted({h for h in hosts.values()}):
        out[g] = (g,) if g in holders else tuple(c for c in hosts if hosts[c] == g and c in holders)
    return out


def setup_from_plan(plan: Plan, holders: Sequence[str] = ()) -> SimSetup:
    """The simulator's view of ``plan``: running components, their processes and device classes.
    ``holders``: the graph's model holders (they say whose state an offload moves and which fused
    component shares its host's weights)."""
    running = [c for c in plan.components if c.active]
    hosts = {c.name: c.host for c in running}
    owners = state_owners(hosts, holders)
    on_device: dict[tuple[int, int], dict[str, int]] = {}
    for c in running:
        for r in c.placement.ranks:
            for dev in r.local_devices:
                slot = on_device.setdefault((r.node_rank, dev), {})
                slot[c.name] = slot.get(c.name, 0) + 1
    by_members: dict[tuple[tuple[str, int], ...], list[tuple[int, int]]] = {}
    for dev, members in sorted(on_device.items()):
        by_members.setdefault(tuple(sorted(members.items())), []).append(dev)
    classes = tuple(DeviceClass(_ranges(devs), len(devs), frozenset(n for n, _ in key), dict(key),
                                tuple(devs[:_LISTED])) for key, devs in by_members.items())
    comps = {}
    for c in running:
        threads = process_threads(c.name, {x.name: x.host for x in running}, {x.name: x.threads for x in running},
                                  plan.executor == "local")
        nodes: dict[int, int] = {}
        for r in c.placement.ranks:
            nodes[r.node_rank] = nodes.get(r.node_rank, 0) + 1
        comps[c.name] = Placed(c.name, c.host, c.world_size, threads, c.shares_devices and not c.fused,
                               c.offload and not c.fused,
                               frozenset(i for i, k in enumerate(classes) if c.name in k.members),
                               tuple(sorted(nodes.items())), () if c.fused else owners[c.name],
                               c.fused and c.name in holders and c.host in holders)
    return SimSetup(comps, classes, dict(plan.settings), plan.executor == "local")


def build_setup(blocks: Sequence[tuple[Sequence[str], int, int]], hosts: Mapping[str, str],
                settings: Mapping[str, Any], *, holders: Sequence[str] = (), offload: Mapping[str, bool] | None = None,
                threads: Mapping[str, int] | None = None, devices_per_node: int | None = None) -> SimSetup:
    """A setup straight from contiguous device ranges, without a Plan: ``blocks`` are
    ``(components, first device, device count)``, one rank per device; ``holders`` are the model
    holders: a process group that holds one (its own, or one fused into it: the policy inside the env
    processes) takes turns where it shares devices with another such group, and offloads unless ``offload``
    says no for a model it holds (holder -> whether it offloads; missing: it does)."""
    threads = threads or {}
    cuts = sorted({p for _, lo, n in blocks for p in (lo, lo + n)})
    classes: list[DeviceClass] = []
    for lo, hi in zip(cuts, cuts[1:]):
        members = frozenset(c for comps, b_lo, n in blocks if b_lo <= lo and hi <= b_lo + n for c in comps)
        if members:
            classes.append(DeviceClass(f"0:{lo}" if hi - lo == 1 else f"0:{lo}-{hi - 1}", hi - lo, members,
                                       {m: 1.0 for m in members},
                                       tuple((0, d) for d in range(lo, min(hi, lo + _LISTED)))))
    placed_names = [c for comps_of, _, _ in blocks for c in comps_of]
    all_hosts = {c: hosts.get(c, c) for c in placed_names}
    owners = state_owners(all_hosts, holders)
    launched_holders = [g for g, moved in owners.items() if moved]
    comps = {}
    for comps_of, lo, n in blocks:
        for c in comps_of:
            mine = frozenset(i for i, k in enumerate(classes) if c in k.members)
            shares = c in launched_holders and any(
                o in classes[i].members for i in mine for o in launched_holders if o != c)
            nodes: tuple[tuple[int, int], ...] = ()
            if devices_per_node:  # devices lo .. lo + n - 1 by node, in O(nodes): thousands of devices are common
                nodes = tuple((node, min(lo + n, (node + 1) * devices_per_node) - max(lo, node * devices_per_node))
                              for node in range(lo // devices_per_node, (lo + n - 1) // devices_per_node + 1))
            fused = all_hosts[c] != c
            offloads = shares and all((offload or {}).get(m, True) for m in owners.get(c, ()))
            comps[c] = Placed(c, all_hosts[c], n, process_threads(c, hosts, threads), shares, offloads,
                              mine, nodes, () if fused else owners[c], fused and c in holders and all_hosts[c] in holders)
    return SimSetup(comps, tuple(classes), dict(settings), all(lo == 0 and n == 1 for _, lo, n in blocks))


def process_threads(name: str, hosts: Mapping[str, str], threads: Mapping[str, int], local: bool = False) -> int:
    """Torch threads of the process ``name`` runs in: its host's (a fused component runs on its host's
    threads); under the local executor every component shares the driver, which takes the most any asks."""
    if local:
        return max((threads.get(c, 1) for c in hosts), default=1)
    return threads.get(hosts.get(name, name), 1)


def input_edges(workload: Workload, graph: WorkflowGraph, setup: SimSetup, name: str) -> list[str]:
    """The graph edges ``name`` receives on that cross processes under ``setup`` (they cost a transfer)."""
    out = []
    comps = setup.components
    for edge_name in workload.inputs.get(name, ()):
        e = graph.edge(edge_name)
        if e.source == DRIVER or e.source not in comps:
            continue
        if e.target != name and e.target in comps:
            continue
        if comps[e.source].host != comps[name].host:
            out.append(edge_name)
    return out
