"""The search against an independent brute-force oracle on small hand-made profiles of both workflows.

The oracle below does not call the search, the simulator, the bound or the memory check: it
enumerates every plan of the documented candidate set (each component on a contiguous device range:
disjoint blocks covering the devices, optionally one component over all of them or on the first
devices of one block; every allowed fusion where component and host share devices; every value of each
varied plan setting)
and times each with the documented cost rules (docs/planner.md, cost.py): a call takes
``a + c b / d^alpha + s log2 d``; a call receiving an edge from another process pays its bytes over
the link; a weight sync between processes costs its bytes over the link before the receiver starts;
process groups that hold a model (their own or one fused into them) and share a device take turns on
it, each change of hands paying the leaver's offload and the newcomer's onload of the state it moves
(the policy's, for env processes running it); memory per device is the sum of its components' bytes,
weights of a holder fused into a holder counted once (the rest of its fixed bytes counted) and offloading groups' moved state counted for
the largest only. Iterations are played by a list scheduler of its own (two iterations, the second
timed). The search's choice must match the oracle's optimum within 1%.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.search import SearchSpace, search
from m2flow.planner.setup import Workload

GIB = 2.0 ** 30

# -- the two workflows, in miniature --------------------------------------------------------------------
REASON = WorkflowGraph("reason", (Component("gen", "generates", holds_model=True),
                                  Component("train", "trains", holds_model=True)),
                       (Edge("items", "gen", "train", "Item"), Edge("weights", "train", "gen", "w", kind="weights")),
                       (Fusion("gen", "train", "same devices"),))
REASON_WORK = Workload(chain=("gen", "train"), items=("batch",), micro_items=("micro",),
                       inputs={"train": ("items",)}, weights=(("train", "gen"),))
EMBODIED = WorkflowGraph("embodied", (Component("env", "steps"), Component("policy", "acts", holds_model=True),
                                      Component("actor", "trains", holds_model=True)),
                         (Edge("obs", "env", "policy", "Obs"), Edge("actions", "policy", "env", "Act"),
                          Edge("traj", "env", "actor", "Traj"), Edge("weights", "actor", "policy", "w", kind="weights")),
                         (Fusion("policy", "env", "same devices"),))
EMBODIED_WORK = Workload(chain=("actor",), items=("envs", "steps"), items_per_rank_of="env", loop=("env", "policy"),
                         loop_steps="steps", loop_items=("envs",), stages="stages",
                         inputs={"policy": ("obs",), "env": ("actions",), "actor": ("traj",)},
                         weights=(("actor", "policy"),))


def reason_space(batch: int = 8, micros: tuple[int, ...] = (1, 2, 4, 8)) -> SearchSpace:
    return SearchSpace(REASON, REASON_WORK, ("gen", "train"), {"batch": batch, "micro": batch},
                       varied={"micro": micros}, fusions=(("gen", "train"),))


def embodied_space(envs: int = 4, steps: int = 3, stages: tuple[int, ...] = (1, 2)) -> SearchSpace:
    return SearchSpace(EMBODIED, EMBODIED_WORK, ("env", "policy", "actor"), {"envs": envs, "steps": steps, "stages": 1},
                       varied={"stages": stages}, fusions=(("policy", "env"),))


# -- the oracle ---------------------------------------------------------------------------------------------
@dataclass
class OraclePlan:
    ranges: dict[str, tuple[int, int]]
    """component -> (first device, device count)"""
    host: dict[str, str]
    settings: dict[str, int]
    """the varied plan settings' values"""
    seconds_per_item: float = math.inf
    memory_ok: bool = True


def _devices(r: tuple[int, int]) -> set[int]:
    return set(range(r[0], r[0] + r[1]))


def layouts(names: list[str], n: int):
    """Every documented placement: disjoint contiguous blocks over all ``n`` devices, then optionally one
    component over all devices (at least two blocks under it) or on the first devices of one block."""
    def blockings(items: list[str]):
        # ordered set partitions into blocks with device counts: each yields [(members, count), ...]
        if not items:
            yield []
            return
        for k in range(1, len(items) + 1):
            for first in itertools.combinations(items, k):
                if items[0] not in first:
                    continue  # blocks in order of their first member (device order does not matter)
                rest = [c for c in items if c not in first]
                for tail in blockings(rest):
                    yield [first] + tail

    def counts(m: int, total: int):
        for cut in itertools.combinations(range(1, total), m - 1):
            yield [b - a for a, b in zip((0,) + cut, cut + (total,))]

    for special in [None] + names:
        rest = [c for c in names if c != special]
        for blocks in blockings(rest):
            for sizes in counts(len(blocks), n) if len(blocks) <= n else []:
                ranges, lo = {}, 0
                for members, k in zip(blocks, sizes):
                    for c in members:
                        ranges[c] = (lo, k)
                    lo += k
                if special is None:
                    yield dict(ranges)
                    continue
                if len(blocks) >= 2:
                    yield {**ranges, special: (0, n)}
                start = 0
                for k in sizes:
                    for inner in range(1, k):
                        yield {**ranges, special: (start, inner)}
                    start += k


def oracle(space: SearchSpace, cost: CostModel, n: int) -> OraclePlan:
    """The fastest plan whose memory fits, by enumeration."""
    best = OraclePlan({}, {}, {})
    names = list(space.varied)
    for ranges in layouts(list(space.running), n):
        for fuse in (False, True):
            (c, h), = space.fusions
            if fuse and ranges[c] != ranges[h]:
                continue
            host = {x: x for x in space.running}
            if fuse:
                host[c] = h
            for values in itertools.product(*(space.varied[k] for k in names)):
                plan = OraclePlan(ranges, host, dict(zip(names, values)))
                evaluate(space, cost, plan)
                if plan.memory_ok and plan.seconds_per_item < best.seconds_per_item * (1 - 1e-12):
                    best = plan
    return best


def shared(k: ComponentCost) -> float:
    """The bytes a model copy fused into another holder takes from its host: its weights (all of its fixed
    bytes when the profile does not give them)."""
    return min(k.weight_bytes, k.mem_fixed) if k.weight_bytes else k.mem_fixed


def call(cost: CostModel, name: str, items: float, ranks: int) -> float:
    k = cost.components[name]
    return k.a + k.c * items / ranks ** k.alpha + k.s * math.log2(ranks)


def evaluate(space: SearchSpace, cost: CostModel, plan: OraclePlan) -> None:
    """Time one plan by the documented rules (fills seconds per item and whether memory fits)."""
    g, w, s = space.graph, space.workload, {**space.settings, **plan.settings}
    ranks = {c: r[1] for c, r in plan.ranges.items()}
    host = plan.host
    bw = cost.link.bandwidth
    holders = [c for c in space.running if g.component(c).holds_model]
    groups = sorted(set(host.values()))
    moves = {x: ([x] if x in holders else [c for c in holders if host[c] == x]) for x in groups}
    dev = {x: _devices(plan.ranges[x]) for x in groups}
    takes_turns = {x: bool(moves[x]) and any(dev[x] & dev[o] for o in groups if o != x and moves[o]) for x in groups}
    swap = {x: sum(cost.components[m].state_bytes for m in moves[x]) / cost.offload_bandwidth if takes_turns[x] else 0.0
            for x in groups}
    scale = ranks[w.items_per_rank_of] if w.items_per_rank_of else 1
    items = math.prod(s[k] for k in w.items) * scale
    micro = min(items, math.prod(s[k] for k in w.micro_items) * scale) if w.micro_items else items

    # Memory per device.
    held = {c: micro for c in space.running}
    if w.loop:
        for c in w.loop:
            held[c] = math.prod(s[k] for k in w.loop_items) * scale
    for d in range(max(r[0] + r[1] for r in plan.ranges.values())):
        on = [c for c in space.running if d in _devices(plan.ranges[c])]
        size = {c: cost.components[c].mem_fixed - (shared(cost.components[c])
                                                    if host[c] != c and c in holders and host[c] in holders else 0.0)
                + cost.components[c].mem_per_item * held[c] / ranks[c] for c in on}
        units = [sum(size[m] for m in moves[x] if m in size) for x in groups if takes_turns[x] and x in on]
        moving = {m for x in groups if takes_turns[x] and x in on for m in moves[x]}
        if sum(v for c, v in size.items() if c not in moving) + max(units, default=0.0) > cost.device_memory:
            plan.memory_ok = False
            return

    def recv(name: str, batch: float) -> float:
        edges = [e for e in w.inputs.get(name, ()) if host[g.edge(e).source] != host[name]]
        return sum(cost.edge_bytes.get(e, 0.0) * batch / ranks[name] / bw for e in edges)

    # Tasks: (group or None, devices it locks or empty, seconds, deps, iteration).
    tasks: list[tuple[str | None, set[int], float, list[int], int]] = []

    def add(comp: str | None, seconds: float, deps: list[int], it: int) -> int:
        grp = host[comp] if comp is not None else None
        locks = dev[grp] if grp is not None and takes_turns[grp] and comp == grp else set()
        tasks.append((grp, locks, seconds, deps, it))
        return len(tasks) - 1

    last: dict[str, int] = {}
    for it in range(2):
        barrier = [last[w.chain[-1]]] if w.chain[-1] in last else []
        synced = {}
        for src, dst in w.weights:
            if host[src] != host[dst]:
                sent = cost.components[src].weight_bytes or cost.components[src].state_bytes  # 0: its state
                synced[dst] = [add(None, sent / bw, [last[src]] if src in last else [], it)]
        after = []
        if w.loop:
            env, pol = w.loop
            stages, steps = s[w.stages], s[w.loop_steps]
            per = math.prod(s[k] for k in w.loop_items) * scale / stages
            t_pol, t_env = call(cost, pol, per, ranks[pol]) + recv(pol, per), call(cost, env, per, ranks[env]) + recv(env, per)
            prev = [last.get(env)] * stages
            for step in range(steps):
                for k in range(stages):
                    deps = [prev[k]] if prev[k] is not None else []
                    if step == 0:
                        deps += synced.get(pol, []) + barrier
                    p = add(pol, t_pol, deps, it)
                    prev[k] = add(env, t_env, [p], it)
            after = list(prev)
            last[env] = max(prev)
        up: list[int | None] = [None] * math.ceil(items / micro - 1e-9)
        for c in w.chain:
            mine = None
            for m in range(len(up)):
                b = micro if m < len(up) - 1 else items - micro * (len(up) - 1)
                deps = [x for x in (up[m], mine) if x is not None]
                if mine is None:
                    deps += synced.get(c, []) + after + ([] if w.loop else barrier) + ([last[c]] if c in last else [])
                mine = add(c, call(cost, c, b, ranks[c]) + recv(c, b), deps, it)
                up[m] = mine
            last[c] = mine

    # A list scheduler: at every event, start each ready task (in creation order) whose group and devices
    # are free; a task taking devices last held by another group first pays both groups' swaps.
    n = len(tasks)
    end = [math.inf] * n
    started = [False] * n
    owner: dict[int, str] = {}
    busy_group: set[str] = set()
    busy_dev: set[int] = set()
    running: list[tuple[float, int]] = []
    now = 0.0
    while not all(started) or running:
        for i, (grp, locks, seconds, deps, _) in enumerate(tasks):
            if started[i] or any(end[d] > now + 1e-12 for d in deps) or grp in busy_group or locks & busy_dev:
                continue
            others = {owner[d] for d in locks if d in owner and owner[d] != grp}
            extra = (swap[grp] + sum(swap[o] for o in others)) if others else 0.0
            for d in locks:
                owner[d] = grp  # type: ignore[assignment]
            started[i] = True
            if grp is not None:
                busy_group.add(grp)
            busy_dev |= locks
            running.append((now + seconds + extra, i))
        now = min(t for t, _ in running)
        for t, i in [x for x in running if x[0] <= now + 1e-12]:
            running.remove((t, i))
            end[i] = now
            busy_group.discard(tasks[i][0])  # type: ignore[arg-type]
            busy_dev -= tasks[i][1]
    ends = [max(end[i] for i in range(n) if tasks[i][4] == it) for it in range(2)]
    plan.seconds_per_item = (ends[1] - ends[0]) / items


# -- the cases --------------------------------------------------------------------------------------------
def reason_cost(gen=(0.1, 1.0, 1.0), train=(0.1, 1.0, 1.0), edge=0.0, state=(0.0, 0.0), weights=0.0,
                mem=None, device_memory=math.inf) -> CostModel:
    mem = mem or {}
    return CostModel({"gen": ComponentCost(*gen, state_bytes=state[0], **mem.get("gen", {})),
                      "train": ComponentCost(*train, state_bytes=state[1], weight_bytes=weights, **mem.get("train", {}))},
                     edge_bytes={"items": edge}, link=Link(bandwidth=1.0, latency=0.0), offload_bandwidth=1.0,
                     device_memory=device_memory)


def embodied_cost(env=(0.01, 0.2, 1.0), policy=(0.02, 0.05, 0.8), actor=(0.5, 0.02, 0.9, 0.1), obs=0.0,
                  state=(0.0, 0.0), weights=0.0, mem=None, device_memory=math.inf) -> CostModel:
    mem = mem or {}
    return CostModel({"env": ComponentCost(*env, **mem.get("env", {})),
                      "policy": ComponentCost(*policy, state_bytes=state[0], **mem.get("policy", {})),
                      "actor": ComponentCost(*actor, state_bytes=state[1], weight_bytes=weights, **mem.get("actor", {}))},
                     edge_bytes={"obs": obs, "actions": obs / 4, "traj": obs}, link=Link(bandwidth=1.0, latency=0.0),
                     offload_bandwidth=1.0, device_memory=device_memory)


CASES = {
    # Work that scales poorly: a pipeline of small micro-batches on devices of their own wins.
    "reason-pipelined": (reason_space(), reason_cost(gen=(0.1, 1.0, 0.5), train=(0.1, 1.0, 0.5)), 4),
    # Heavy edges and cheap swaps: collocated and fused (no transfer) wins.
    "reason-collocated": (reason_space(), reason_cost(edge=2.0), 4),
    # Micro-batch size matters: a fixed cost per call against pipelining.
    "reason-micro-batch": (reason_space(), reason_cost(gen=(1.5, 1.0, 0.7), train=(0.2, 2.0, 0.7)), 4),
    # Taking turns costs a large offload: the plan that avoids it on shared devices (gen fused into train) wins.
    "reason-expensive-offload": (reason_space(), reason_cost(state=(6.0, 10.0), weights=0.5), 4),
    # Memory only a fused plan meets: gen's own copy of the model does not fit a device; fused into
    # train it uses train's weights (counted once) and adds only its per-item bytes.
    "reason-memory-fused": (reason_space(micros=(4, 8)),
                            reason_cost(gen=(0.1, 1.0, 0.6), train=(0.1, 1.0, 0.6), edge=0.1,
                                        mem={"gen": {"mem_fixed": 11 * GIB, "mem_per_item": 0.1 * GIB},
                                             "train": {"mem_fixed": 6 * GIB}}, device_memory=10 * GIB), 3),
    # The env is the bottleneck: it takes every device, the others beside it, in two pipeline stages.
    "embodied-env-bound": (embodied_space(), embodied_cost(env=(0.01, 0.4, 1.0)), 4),
    # A fused policy whose offload is expensive: the fused plan must pay the policy's state, not the env's.
    "embodied-fused-expensive-offload": (embodied_space(), embodied_cost(obs=0.5, state=(8.0, 1.0), weights=0.1), 4),
    # Cheap policy and heavy observations: the policy fused into env processes wins.
    "embodied-fused-wins": (embodied_space(), embodied_cost(obs=2.0, state=(0.01, 0.01)), 4),
    # Memory that fits only because the fused policy takes turns with the actor (and offloads): env, policy
    # and actor together exceed a device; heavy observations make the fused plan the fastest.
    "embodied-memory-turns": (embodied_space(), embodied_cost(obs=2.0, state=(0.05, 0.05), mem={
        "env": {"mem_fixed": 5 * GIB}, "policy": {"mem_fixed": 4 * GIB}, "actor": {"mem_fixed": 4 * GIB}},
        device_memory=9.5 * GIB), 2),
    # Pipeline stages matter: a slow policy overlaps the env when stepped in two stages.
    "embodied-stages": (embodied_space(envs=8), embodied_cost(env=(0.01, 0.2, 1.0), policy=(0.01, 0.2, 1.0)), 3),
    # The actor's collectives cost: it takes one device of the env's four (a hybrid plan).
    "embodied-collectives": (embodied_space(), embodied_cost(actor=(0.5, 0.02, 0.9, 3.0), obs=0.05), 4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_search_finds_the_oracles_optimum(name):
    space, cost, devices = CASES[name]
    best = oracle(space, cost, devices)
    assert best.seconds_per_item < math.inf, "the oracle found no plan that fits"
    found = search(space, cost, devices, top=3)
    chosen = found.ranked[0]
    assert chosen.plan is not None  # a built, validated Plan
    assert chosen.seconds_per_item == pytest.approx(best.seconds_per_item, rel=0.01), (name, best, chosen.placement)


def test_the_cases_pull_the_intended_ways():
    """The oracle's optimum of each case is of the kind the case is about (the cases test what they say)."""
    def best(name: str) -> OraclePlan:
        return oracle(*CASES[name])

    pipe = best("reason-pipelined")
    assert pipe.ranges["gen"] != pipe.ranges["train"] and pipe.settings["micro"] < 8
    col = best("reason-collocated")
    assert col.ranges["gen"] == col.ranges["train"] and col.host["gen"] == "train"
    assert best("reason-memory-fused").host["gen"] == "train"
    turns = best("embodied-memory-turns")
    assert turns.host["policy"] == "env" and _devices(turns.ranges["env"]) & _devices(turns.ranges["actor"])
    assert best("embodied-fused-wins").host["policy"] == "env"
    assert best("embodied-stages").settings["stages"] == 2
    off = best("reason-expensive-offload")
    assert off.host["gen"] == "train" or not _devices(off.ranges["gen"]) & _devices(off.ranges["train"])
    assert best("embodied-collectives").ranges["actor"][1] == 1
    assert best("embodied-fused-expensive-offload").host["policy"] == "env"
    micro = {m: oracle(reason_space(micros=(m,)), CASES["reason-micro-batch"][1], 4).seconds_per_item for m in (1, 8)}
    assert abs(micro[1] / micro[8] - 1) > 0.05  # the micro-batch size changes the time by more than 5%


@pytest.mark.parametrize("name", ["reason-pipelined", "reason-expensive-offload", "reason-memory-fused",
                                  "embodied-fused-expensive-offload"])
def test_the_same_at_32_devices(name):
    space, cost, _ = CASES[name]
    if name.startswith("embodied"):
        space = embodied_space(envs=4, steps=2, stages=(2,))  # one stage count: the oracle enumerates ~10^4 plans
    best = oracle(space, cost, 32)
    found = search(space, cost, 32, top=1)
    assert not found.exact  # the scalable search, above the exhaustive range
    assert found.ranked[0].plan is not None
    assert found.ranked[0].seconds_per_item == pytest.approx(best.seconds_per_item, rel=0.01)
