"""Fast lower bounds and memory checks for one shape of plan as its device counts change.

The search scores tens of thousands of device splits; building a ``SimSetup`` for each would cost
more than the search may. Which components share processes, device locks and memory depends on
the shape (and fusions) alone, not on the counts, so ``FastBound`` reads that structure once from a
template setup and then evaluates a split from the rank count of each component in microseconds.

The bound (seconds of an iteration, never above what ``Simulator`` predicts):
``sync + loop + chain`` where ``sync`` is the longest weight sync, ``loop`` the larger of one
stage's policy-env steps in sequence and the busiest process group / device lock in the loop, and
``chain`` the flow-shop bound: for each process group or device lock G of chain components, the
first calls of the chain before G's first member, G's whole work, and the last calls after G's
last member. Running ahead (the workload's ``run_ahead`` setting above 0: bounded staleness), the
syncs, the loop and the first and last calls overlap other iterations: ``sync + loop + chain`` becomes
the larger of ``loop`` and the busiest group's work. A device lock that several processes take turns
on is held, each iteration, for all their work plus an offload and an onload of each (the lock
changes hands at least once per taker).
On CPU machines the iteration also lasts at least the whole demand (seconds x ranks x threads x CPU
share of every component: a component's waiting asks nothing of the cores) over all the cores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from m2flow.planner.cost import CostModel
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.memory import MemoryCheck
from m2flow.planner.setup import SimSetup, Workload, input_edges


class FastBound:
    """Bound and memory of every split of one template setup's structure."""

    def __init__(self, graph: WorkflowGraph, workload: Workload, cost: CostModel, template: SimSetup,
                 nodes: int = 1) -> None:
        self.w, self.cost = workload, cost
        comps = template.components
        self.names = list(comps)
        link = cost.link
        # Per component: (curve, messages per call, bytes per item received across processes).
        self.calls = {}
        for c in self.names:
            edges = input_edges(workload, graph, template, c)
            self.calls[c] = (cost.component(c), [graph.edge(e).source for e in edges],
                             0.0 if template.in_driver else sum(cost.edge_bytes.get(e, 0.0) for e in edges))
        self.link_latency, self.link_bw = link.message(template.in_driver), link.bandwidth
        hosts = {c: p.host for c, p in comps.items()}
        self.factor = {c: cost.factor(c, template.in_driver, hosts) for c in self.names}
        self.dispatch = link.call(template.in_driver)  # as Simulator.dispatch: once per iteration
        groups: dict[object, list[str]] = {}
        for c, p in comps.items():
            groups.setdefault(("group", p.host), []).append(c)
            if p.takes_turns:
                for k in p.classes:
                    groups.setdefault(("class", k), []).append(c)
        self.groups = [g for g in groups.values()]
        # A device lock that two or more processes take turns on changes hands at least once per taker in
        # an iteration, each change paying the leaver's offload and the newcomer's onload (simulate.py).
        def one_way(c: str) -> float:
            p = comps[c]
            return sum(cost.offload_time(m) for m in p.moves) if p.offload else 0.0

        self.locks = [(g, 2 * sum(one_way(c) for c in g)) for key, g in groups.items()
                      if key[0] == "class" and len(g) >= 2]
        self.chain = [c for c in workload.chain if c in comps]
        # Per group of chain components: (members, chain components before the first, after the last).
        order = {c: i for i, c in enumerate(self.chain)}
        self.chain_groups = []
        for g in self.groups:
            idx = sorted(order[c] for c in g if c in order)
            if idx:
                self.chain_groups.append(([self.chain[i] for i in idx], self.chain[:idx[0]], self.chain[idx[-1] + 1:]))
        self.loop = tuple(workload.loop) if workload.loop and all(c in comps for c in workload.loop) else ()
        s = template.settings
        self.items0 = template.setting(workload.items)
        self.micro0 = template.setting(workload.micro_items) if workload.micro_items else None
        self.stages = int(s.get(workload.stages, 1)) if workload.stages else 1
        self.steps = int(s[workload.loop_steps]) if self.loop else 0
        self.loop_items0 = template.setting(workload.loop_items) if self.loop else 0.0
        self.syncs = [cost.link.transfer(cost.sync_bytes(a)) for a, b in workload.weights
                      if a in comps and b in comps and comps[a].host != comps[b].host]
        # Running ahead (bounded staleness), an iteration's first and last calls and its weight syncs
        # overlap the iterations beside it: only each process group's own work stays serial.
        self.ahead = int(s.get(workload.run_ahead, 0)) if workload.run_ahead else 0
        # Memory: the same rule as the built Plan's check (``memory.MemoryCheck``).
        self.memory_check = MemoryCheck(template)
        self.threads = {c: p.threads for c, p in comps.items()}
        self.share = {c: min(1.0, max(0.0, cost.component(c).cpu_share)) for c in comps}
        self.all_cores = cost.cores * nodes if cost.cores is not None else None

    def _t(self, c: str, items: float, ranks: Mapping[str, int]) -> float:
        curve, senders, per_item = self.calls[c]
        mine = ranks[c]
        seconds = curve.time(items, mine, self.threads[c] if self.cost.cores is not None else 0) * self.factor[c]
        if senders:  # as Simulator._call: a message per sender rank served, then the bytes
            messages = sum(max(1, -(-ranks[s] // mine)) for s in senders)
            seconds += messages * self.link_latency + per_item * items / mine / self.link_bw
        return seconds

    def sizes(self, ranks: Mapping[str, int]) -> tuple[float, float, int]:
        scale = ranks[self.w.items_per_rank_of] if self.w.items_per_rank_of in ranks else 1
        items = self.items0 * scale
        micro = min(items, self.micro0 * scale) if self.micro0 is not None else items
        return items, micro, max(1, math.ceil(items / micro - 1e-9))

    def evaluate(self, ranks: Mapping[str, int]) -> tuple[float, float]:
        """(lower bound on the iteration time in seconds, items per iteration) for these rank counts."""
        items, micro, n = self.sizes(ranks)
        rest = items - micro * (n - 1)
        t_micro = {c: self._t(c, micro, ranks) for c in self.chain}
        t_rest = t_micro if abs(rest - micro) <= 1e-12 * micro else {c: self._t(c, rest, ranks) for c in self.chain}
        first = {c: t_micro[c] + self.dispatch for c in self.chain}
        last = {c: t_rest[c] + (self.dispatch if n == 1 else 0.0) for c in self.chain}
        work = {c: (n - 1) * first[c] + last[c] - (self.dispatch * (n - 2) if n > 1 else 0.0) for c in self.chain}
        loop = 0.0
        if self.loop:
            scale = ranks[self.w.items_per_rank_of] if self.w.items_per_rank_of in ranks else 1
            per_stage = self.loop_items0 * scale / self.stages
            env, policy = self.loop
            t_env, t_pol = self._t(env, per_stage, ranks), self._t(policy, per_stage, ranks)
            loop_work = {env: self.stages * self.steps * t_env + self.dispatch,
                         policy: self.stages * self.steps * t_pol + self.dispatch}
            loop = self.steps * (t_env + t_pol) + 2 * self.dispatch
            for g in self.groups:
                loop = max(loop, sum(loop_work.get(c, 0.0) for c in g))
        chain = 0.0
        for members, before, after in self.chain_groups:
            head = sum(first[c] for c in before) if not self.ahead else 0.0
            tail = sum(last[c] for c in after) if not self.ahead else 0.0
            chain = max(chain, head + sum(work[c] for c in members) + tail)
        bound = max(loop, chain) if self.ahead else max(self.syncs, default=0.0) + loop + chain
        for members, switches in self.locks:  # the lock is held for all its takers' work and their switches
            held = sum(work.get(c, 0.0) + (loop_work.get(c, 0.0) if self.loop else 0.0) for c in members)
            bound = max(bound, held + switches)
        if self.all_cores is not None:
            demand = sum(w * ranks[c] * self.threads[c] * self.share[c] for c, w in work.items())
            if self.loop:
                demand += sum(w * ranks[c] * self.threads[c] * self.share[c] for c, w in loop_work.items())
            bound = max(bound, demand / self.all_cores)
        return bound, items

    def _held(self, ranks: Mapping[str, int]) -> dict[str, float]:
        """Items each component holds at once (as ``Simulator.call_items``)."""
        items, micro, _ = self.sizes(ranks)
        held = dict.fromkeys(self.names, micro)
        if self.loop:
            scale = ranks[self.w.items_per_rank_of] if self.w.items_per_rank_of in ranks else 1
            for c in self.loop:
                held[c] = self.loop_items0 * scale
        return held

    def memory(self, ranks: Mapping[str, int]) -> tuple[dict[str, float], str]:
        """Bytes per device of each class, and why it does not fit (empty when it does)."""
        return self.memory_check.evaluate(self.cost, self._held(ranks), ranks)

    def fits(self, ranks: Mapping[str, int]) -> bool:
        """Whether the memory of every class fits (``memory`` without the report)."""
        return self.memory_check.fits(self.cost, self._held(ranks), ranks)
