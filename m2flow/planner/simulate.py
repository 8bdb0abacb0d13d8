"""Discrete-event simulator: plays iterations of a plan from the cost model and predicts their time.

The iteration becomes a graph of tasks (``build_tasks``): weight syncs first; then, if the workload
has a loop, policy and env alternate ``loop_steps`` times for each of the ``stages`` pipeline
stages (stage k's next policy call waits only for stage k's env step, so stages overlap); then each
chain component processes every micro-batch, a micro-batch moving downstream as soon as it is done.
A task runs when its inputs are done and its resources are free:

* its process group (a group runs one task at a time; a fused component runs in its host's group);
* the device lock of every device class it sits on, if it takes turns there. When a lock changes
  hands, the newcomer pays its onload and the previous holder its offload, once per turn: the state
  of what the process moves (``Placed.moves``: the policy's weights for env processes that run it);
* CPU cores: running tasks slow down together, each at the speed of the threads all busy processes
  of its node want (processor sharing, and a multi-threaded process slower still beyond the cores),
  only in the share of its time it computes (``CostModel.node_speed``, ``CostModel.rate``: a
  component that mostly waits, on a tool, asks little of the cores and is slowed little), so the
  simulation is fluid: the time of the next event is recomputed whenever a task starts or ends.

A call takes the cost model's ``factor`` times its curve: ``process_factor`` in Ray processes,
``split_factor`` for model holders on several rank threads of the driver (``CostModel``). A call
receiving on an edge from another process group pays the link's latency per message and
the bytes (under the local executor, rank threads of the driver: its ``local_latency`` per message).
Outside the driver, a component's first call or step of an iteration also pays the driver's call to
its processes (``Simulator.dispatch``: the link's ``dispatch``).
With bounded staleness (the workload's ``run_ahead`` setting, ``a`` iterations) iteration ``it`` waits
for the training of iteration ``it - 1 - a`` only, and its weight syncs carry those weights, so the work
of up to ``a`` iterations overlaps training; each process still runs its tasks in order.
Ready tasks start in creation order (earlier iterations, steps and micro-batches first). Simulated
iterations are identical but for the first, which starts with cold locks; ``simulate`` plays two and
reports the second. Times are seconds.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m2flow.planner.cost import CostModel
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.setup import Placed, SimSetup, Workload, input_edges

_EPS = 1e-12


@dataclass
class Task:
    """One call of one component (or a weight sync) in the simulated iteration."""

    id: int
    component: str
    """the component whose call this is (a weight sync's target)"""
    group: str | None
    """process group it occupies (None: occupies none, e.g. a sync between processes)"""
    work: float
    """seconds at full speed"""
    deps: list[int]
    iteration: int
    name: str
    cat: str
    takes_turns: bool = False
    threads_by_node: tuple[tuple[int, int], ...] = ()
    threads: int = 1
    """torch threads of each of its processes"""
    cpu_share: float = 1.0
    """part of its time its processes want a core (``ComponentCost.cpu_share``); the rest waits"""
    start: float = math.nan
    end: float = math.nan
    switch: float = 0.0
    """seconds of offload / onload paid at its start"""


@dataclass
class SimResult:
    """What one simulation predicts."""

    iteration_time: float
    """seconds of one steady-state iteration"""
    makespan: float
    """seconds from the start of the first simulated iteration to the end of the last"""
    tasks: list[Task]
    busy: dict[str, list[tuple[float, float]]]
    """per device class (its label): the intervals in which some task sits on it"""
    component_time: dict[str, float]
    """per component: seconds of its calls in the last iteration (its busy time)"""
    iteration_ends: list[float] = field(default_factory=list)

    def utilisation(self) -> dict[str, float]:
        """Fraction of the last iteration each device class is busy."""
        start = self.iteration_ends[-2] if len(self.iteration_ends) > 1 else 0.0
        span = self.makespan - start
        return {label: sum(max(0.0, min(b, self.makespan) - max(a, start)) for a, b in iv) / span if span else 0.0
                for label, iv in self.busy.items()}

    def idle(self) -> dict[str, list[tuple[float, float]]]:
        """Per device class: the intervals of the last iteration in which nothing runs on it."""
        start = self.iteration_ends[-2] if len(self.iteration_ends) > 1 else 0.0
        out = {}
        for label, iv in self.busy.items():
            gaps, at = [], start
            for a, b in iv:
                if b <= start:
                    continue
                if a > at + _EPS:
                    gaps.append((at, min(a, self.makespan)))
                at = max(at, b)
            if at < self.makespan - _EPS:
                gaps.append((at, self.makespan))
            out[label] = gaps
        return out

    @property
    def bottleneck(self) -> str:
        """The component busy longest in an iteration."""
        return max(self.component_time, key=lambda c: self.component_time[c])


class Simulator:
    """Builds and plays the task graph of a setup under a cost model."""

    def __init__(self, graph: WorkflowGraph, workload: Workload, cost: CostModel) -> None:
        self.graph, self.workload, self.cost = graph, workload, cost

    # -- the task graph ----------------------------------------------------------------------------
    def _call(self, setup: SimSetup, name: str, items: float) -> float:
        """Seconds of one call of ``name`` on ``items`` items, receiving them over its crossing edges
        (a latency per message, one message per sender rank it serves, and the bytes; in the driver a
        hand-off between rank threads: its latency per message and no bytes)."""
        p = setup.components[name]
        link = self.cost.link
        hosts = {c: q.host for c, q in setup.components.items()}
        seconds = self.cost.call_time(name, items, p.ranks, p.threads) * self.cost.factor(name, setup.in_driver, hosts)
        for edge in input_edges(self.workload, self.graph, setup, name):
            # A rank receives one message from each sender rank it serves (fan-in).
            senders = setup.components[self.graph.edge(edge).source].ranks
            fan_in = max(1, math.ceil(senders / p.ranks))
            seconds += fan_in * link.message(setup.in_driver)
            if not setup.in_driver:
                seconds += self.cost.edge_bytes.get(edge, 0.0) * items / p.ranks / link.bandwidth
        return seconds

    def dispatch(self, setup: SimSetup) -> float:
        """Seconds of the driver's call to a component's processes, once per iteration (its first
        call or step pays it); nothing when everything runs in the driver."""
        return self.cost.link.call(setup.in_driver)

    def build_tasks(self, setup: SimSetup, iterations: int = 2) -> list[Task]:
        """The tasks of ``iterations`` back-to-back iterations, in start priority order."""
        w, comps = self.workload, setup.components
        tasks: list[Task] = []

        def add(name: str, work: float, deps: list[int], it: int, label: str, cat: str, in_group: bool = True) -> int:
            """A task of ``name``; ``in_group=False``: it occupies no process and no device (a transfer)."""
            p = comps[name]
            node_threads = tuple((n, r * p.threads) for n, r in p.node_ranks) if in_group else ()
            tasks.append(Task(len(tasks), name, p.host if in_group else None, work, deps, it, label, cat,
                              p.takes_turns and in_group, node_threads, p.threads, self.cost.component(name).cpu_share))
            return len(tasks) - 1

        items, micro, n_micro = self.sizes(setup)
        chain = [c for c in w.chain if c in comps]
        last_of: dict[str, int] = {}
        done: list[dict[str, int]] = []  # per iteration: each component's last task in it
        ahead = int(setup.settings.get(w.run_ahead, 0)) if w.run_ahead else 0
        once = self.dispatch(setup)
        for it in range(iterations):
            # Iteration it starts from the weights trained through iteration it - 1 - ahead (on-policy:
            # ahead 0, the last one); the work of the iterations between overlaps that training.
            trained = done[it - 1 - ahead] if it - 1 - ahead >= 0 else {}
            barrier = [trained[chain[-1]]] if chain and chain[-1] in trained else []
            synced: dict[str, list[int]] = {}
            for src, dst in w.weights:
                if src in comps and dst in comps and comps[src].host != comps[dst].host:
                    seconds = self.cost.link.transfer(self.cost.sync_bytes(src))
                    deps = [trained[src]] if src in trained else []
                    tid = add(dst, seconds, deps, it, f"sync {src}->{dst}", "weight_sync", in_group=False)
                    synced.setdefault(dst, []).append(tid)
            after_loop: list[int] = []
            if self._has_loop(setup):
                env, policy = w.loop
                stages, steps, per_stage = self.loop_sizes(setup)
                t_pol, t_env = self._call(setup, policy, per_stage), self._call(setup, env, per_stage)
                prev = [last_of.get(env)] * stages
                for step in range(steps):
                    for k in range(stages):
                        deps = [d for d in (prev[k],) if d is not None]
                        if step == 0:
                            deps += synced.get(policy, []) + barrier
                        first = once if step == 0 and k == 0 else 0.0
                        pol = add(policy, t_pol + first, deps, it, f"{policy} s{k}", w.categories.get(policy, policy))
                        prev[k] = add(env, t_env + first, [pol], it, f"{env} s{k}", w.categories.get(env, env))
                after_loop = [p for p in prev if p is not None]
                last_of[env] = max(after_loop)
            upstream: list[int | None] = [None] * n_micro
            for c in chain:
                t_full = self._call(setup, c, micro)
                rest = items - micro * (n_micro - 1)
                mine = None
                for m in range(n_micro):
                    deps = [d for d in (upstream[m], mine) if d is not None]
                    if mine is None:
                        deps += synced.get(c, []) + after_loop + (barrier if not w.loop else [])
                        if c in last_of:
                            deps.append(last_of[c])
                    work = (t_full if m < n_micro - 1 else self._call(setup, c, rest)) + (once if m == 0 else 0.0)
                    mine = add(c, work, deps, it, f"{c} mb{m}", w.categories.get(c, c))
                    upstream[m] = mine
                last_of[c] = mine  # type: ignore[assignment]
            done.append(dict(last_of))
        return tasks

    def sizes(self, setup: SimSetup) -> tuple[float, float, int]:
        """(items per iteration, items per chain micro-batch, micro-batches per iteration)."""
        w, comps = self.workload, setup.components
        scale = comps[w.items_per_rank_of].ranks if w.items_per_rank_of in comps else 1
        items = setup.setting(w.items) * scale
        micro = min(items, setup.setting(w.micro_items) * scale) if w.micro_items else items
        return items, micro, max(1, math.ceil(items / micro - 1e-9))

    def loop_sizes(self, setup: SimSetup) -> tuple[int, int, float]:
        """(pipeline stages, loop steps, items per stage per step) of the workload's loop."""
        w, comps = self.workload, setup.components
        scale = comps[w.items_per_rank_of].ranks if w.items_per_rank_of in comps else 1
        stages = int(setup.settings.get(w.stages, 1)) if w.stages else 1
        return stages, int(setup.settings[w.loop_steps]), setup.setting(w.loop_items) * scale / stages

    def items(self, setup: SimSetup) -> float:
        return self.sizes(setup)[0]

    def _has_loop(self, setup: SimSetup) -> bool:
        return bool(self.workload.loop) and all(c in setup.components for c in self.workload.loop)

    def call_items(self, setup: SimSetup) -> dict[str, float]:
        """Items a component holds at once: a micro-batch of the chain, one step of all loop stages."""
        _, micro, _ = self.sizes(setup)
        out = {c: micro for c in setup.components}
        if self._has_loop(setup):
            stages, _, per_stage = self.loop_sizes(setup)
            for c in self.workload.loop:  # type: ignore[union-attr]
                out[c] = per_stage * stages
        return out

    def work(self, setup: SimSetup) -> dict[str, float]:
        """Seconds each running component computes per iteration, at full speed (no waits, no turns)."""
        items, micro, n_micro = self.sizes(setup)
        out = {c: 0.0 for c in setup.components}
        for c in self.workload.chain:
            if c in out:
                rest = items - micro * (n_micro - 1)
                out[c] = (n_micro - 1) * self._call(setup, c, micro) + self._call(setup, c, rest) + self.dispatch(setup)
        if self._has_loop(setup):
            stages, steps, per_stage = self.loop_sizes(setup)
            for c in self.workload.loop:  # type: ignore[union-attr]
                out[c] += stages * steps * self._call(setup, c, per_stage) + self.dispatch(setup)
        return out

    # -- playing it --------------------------------------------------------------------------------
    def play(self, setup: SimSetup, tasks: list[Task]) -> list[Task]:
        """Run the tasks: fills each task's start, end and switch cost; returns them."""
        comps = setup.components
        waiting = [len(t.deps) for t in tasks]
        children: list[list[int]] = [[] for _ in tasks]
        for t in tasks:
            for d in t.deps:
                children[d].append(t.id)
        ready = [t.id for t in tasks if not t.deps]
        heapq.heapify(ready)
        busy_groups: set[str] = set()
        lock_owner: dict[int, str] = {}
        held: set[int] = set()
        running: dict[int, float] = {}  # task id -> remaining work (seconds at full speed)
        now, done = 0.0, 0
        contention = self.cost.cores is not None
        while done < len(tasks):
            blocked = []
            while ready:
                tid = heapq.heappop(ready)
                t = tasks[tid]
                locks = comps[t.component].classes if t.takes_turns else frozenset()
                if (t.group is not None and t.group in busy_groups) or locks & held:
                    blocked.append(tid)
                    continue
                if t.group is not None:
                    busy_groups.add(t.group)
                previous = {lock_owner[k] for k in locks if k in lock_owner and lock_owner[k] != t.component}
                if previous:
                    t.switch = self.switch_time(comps[t.component]) + sum(
                        self.switch_time(comps[h]) for h in previous)
                for k in locks:
                    lock_owner[k] = t.component
                held |= locks
                t.start = now
                running[tid] = t.work + t.switch
            for tid in blocked:
                heapq.heappush(ready, tid)
            if not running:
                raise RuntimeError(f"simulation stuck at {now:.3f}s with {len(tasks) - done} tasks left")
            speed = self._speeds(tasks, running) if contention else None
            dt = min(rem / (speed[tid] if speed else 1.0) for tid, rem in running.items())
            now += dt
            finished = []
            for tid in list(running):
                running[tid] -= dt * (speed[tid] if speed else 1.0)
                if running[tid] <= _EPS * max(1.0, now):
                    finished.append(tid)
            for tid in finished:
                del running[tid]
                t = tasks[tid]
                t.end = now
                done += 1
                if t.group is not None:
                    busy_groups.discard(t.group)
                if t.takes_turns:
                    held -= comps[t.component].classes
                for child in children[tid]:
                    waiting[child] -= 1
                    if waiting[child] == 0:
                        heapq.heappush(ready, child)
        return tasks

    def switch_time(self, placed: Placed) -> float:
        """Seconds one way of an offload (or onload) of ``placed``'s process: the state of what it moves
        (the policy, for env processes that run it), nothing when it does not offload."""
        return sum(self.cost.offload_time(m) for m in placed.moves) if placed.offload else 0.0

    def _speeds(self, tasks: list[Task], running: Mapping[int, float]) -> dict[int, float]:
        """Seconds of work per second of each running task: its node's computing speed (``CostModel.node_speed``
        over the busy processes' threads and CPU shares) applied to its own CPU share (``CostModel.rate``)."""
        demands: dict[int, list[tuple[float, float]]] = {}
        for tid in running:
            for node, threads in tasks[tid].threads_by_node:
                demands.setdefault(node, []).append((threads, tasks[tid].cpu_share))
        nodes = {n: (self.cost.node_speed(d), sum(k * s for k, s in d) > self.cost.cores) for n, d in demands.items()}
        return {tid: min((self.cost.rate(nodes[n][0], tasks[tid].threads, tasks[tid].cpu_share, nodes[n][1])
                          for n, _ in tasks[tid].threads_by_node), default=1.0) for tid in running}

    def simulate(self, setup: SimSetup, iterations: int = 2) -> SimResult:
        """Play ``iterations`` iterations of ``setup`` and predict the last one's time."""
        tasks = self.play(setup, self.build_tasks(setup, iterations))
        ends = [max((t.end for t in tasks if t.iteration == i), default=0.0) for i in range(iterations)]
        makespan = ends[-1]
        iteration_time = makespan - (ends[-2] if iterations > 1 else 0.0)
        busy: dict[str, list[tuple[float, float]]] = {k.label: [] for k in setup.classes}
        comp_time: dict[str, float] = {c: 0.0 for c in setup.components}
        for t in tasks:
            if t.group is None:
                continue
            if t.iteration == iterations - 1:
                comp_time[t.component] += t.end - t.start
            for k in setup.components[t.component].classes:
                busy[setup.classes[k].label].append((t.start, t.end))
        for label, iv in busy.items():
            busy[label] = _union(iv)
        return SimResult(iteration_time, makespan, tasks, busy, comp_time, ends)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1] + _EPS:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def write_trace(result: SimResult, setup: SimSetup, path: str | Path, max_ranks: int = 8) -> Path:
    """Write the simulated iterations as a Chrome trace that ``m2flow report`` reads like a measured one.

    One process row per rank of every process group (the first ``max_ranks`` ranks; ranks of a
    group run in lockstep), named ``group[rank] @node0`` like a measured run; a driver row carries
    one ``step`` span per iteration. Offload / onload at the start of a turn is its own span.
    """
    path = Path(path)
    if path.suffix != ".json":
        path = path / "trace.json"
    groups = sorted({p.host for p in setup.components.values()})
    processes: list[dict[str, Any]] = [{"pid": 1, "name": "driver @node0", "group": "driver", "rank": 0,
                                        "node_rank": 0, "devices": []}]
    rows: dict[str, list[int]] = {}
    for g in groups:
        members = [p for p in setup.components.values() if p.host == g]
        ranks = max(p.ranks for p in members)
        owner = max(members, key=lambda p: p.ranks)
        devices = sorted({d for k in owner.classes for d in setup.classes[k].devices})
        for r in range(min(ranks, max_ranks)):
            pid = len(processes) + 1
            rows.setdefault(g, []).append(pid)
            # Rank r sits on the r-th device of its group, as a placement without rank ranges puts it.
            node, dev = devices[r * len(devices) // ranks] if devices else (0, r)
            processes.append({"pid": pid, "name": f"{g}[{r}] @node{node}", "group": g, "rank": r, "node_rank": node,
                              "devices": [dev]})
    events: list[dict[str, Any]] = []
    for p in processes:
        events.append({"ph": "M", "name": "process_name", "pid": p["pid"], "tid": 0, "args": {"name": p["name"]}})
    us = 1e6
    starts = [0.0] + result.iteration_ends[:-1]
    for i, (a, b) in enumerate(zip(starts, result.iteration_ends)):
        events.append({"ph": "X", "name": f"step {i}", "cat": "step", "pid": 1, "tid": 1, "ts": a * us,
                       "dur": (b - a) * us, "args": {"step": i}})
    for t in result.tasks:
        if t.group is None:
            continue
        for pid in rows[t.group]:
            if t.switch:
                cut = t.start + (t.end - t.start) * t.switch / (t.work + t.switch)
                events.append({"ph": "X", "name": "onload", "cat": "onload", "pid": pid, "tid": 1,
                               "ts": t.start * us, "dur": (cut - t.start) * us})
            else:
                cut = t.start
            events.append({"ph": "X", "name": t.name, "cat": t.cat, "pid": pid, "tid": 1, "ts": cut * us,
                           "dur": (t.end - cut) * us, "args": {"iteration": t.iteration}})
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"m2flow": {"origin_ns": 0, "processes": processes, "simulated": True}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace), encoding="utf-8")
    return path
