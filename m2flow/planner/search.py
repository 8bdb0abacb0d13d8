"""Search the execution plans of a workflow on N devices for the one the simulator predicts fastest.

Candidates: every shape (``shapes.py``) times a device count per block, every fusion the graph
allows where component and host share devices, every value of each searched setting. A candidate
is a ``PlanChoice`` (placement, fusions taken, setting values, in the Plan's own terms); its Plan is
built by the one builder (``build.build_plan``) under the workflow's constraints or, for a bare
space, ``candidate_plan.plan_of``'s, and only built, validated Plans are ranked.

Scoring: seconds per item of a simulated steady iteration (``Simulator``). Every candidate gets a
lower bound on its iteration time and a memory check (``bound.FastBound``, ``memory.MemoryCheck``);
then best first (``Searcher.best_first``): bounds are simulated, simulated candidates built, in order
of what is known of each, and the first built plan whose time no key left can beat is the simulated
optimum of the enumerated set. Device counts: every composition of N up to ``exact_limit`` devices;
above, grid splits and local search from the best of them (``Searcher._block_splits``), with the gap
measured by ``benchmarks/s2_planner_scale.py``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from m2flow.planner.bound import FastBound
from m2flow.planner.candidate_plan import plan_of
from m2flow.planner.choice import PlanChoice
from m2flow.planner.cost import CostModel
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.memory import MemoryCheck
from m2flow.planner.plan import Plan
from m2flow.planner.setup import SimSetup, Workload, build_setup, setup_from_plan
from m2flow.planner.shapes import Shape, grid_splits, compositions, set_partitions, shapes
from m2flow.planner.simulate import SimResult, Simulator
from m2flow.runtime.placement import NodeLayout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSpace:
    """What may vary, for one workflow config."""

    graph: WorkflowGraph
    workload: Workload
    running: tuple[str, ...]
    """components that run under the config (inactive optional ones ride on the last block)"""
    settings: Mapping[str, Any]
    """the plan settings of the config as it is"""
    varied: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """plan setting -> the values to try (by the Plan's own setting names)"""
    fusions: tuple[tuple[str, str], ...] = ()
    """(component, host) pairs of the graph's fusions the search may take"""
    threads: Mapping[str, int] = field(default_factory=dict)
    offload: Mapping[str, bool] = field(default_factory=dict)
    """model holder -> whether it offloads while another takes the shared devices (missing: it does)"""

    @property
    def holders(self) -> tuple[str, ...]:
        return tuple(c for c in self.running if self.graph.component(c).holds_model)


@dataclass
class Candidate:
    """One plan the search considered: how to ask for it, and what it is predicted to do."""

    shape: Shape
    parts: tuple[int, ...]
    """devices of each block (then of the inner component, if the shape has one)"""
    choice: PlanChoice
    """the plan: placement, fusions taken, values of the searched settings"""
    bound: float = 0.0
    """lower bound on its iteration time, seconds"""
    result: SimResult | None = None
    setup: SimSetup | None = None
    plan: Plan | None = None
    items: float = 0.0
    """items per iteration"""
    memory: dict[str, float] = field(default_factory=dict)
    """bytes per device, by device class"""
    rejected: str = ""

    @property
    def placement(self) -> str:
        return self.choice.placement

    @property
    def seconds_per_item(self) -> float:
        return self.result.iteration_time / self.items if self.result and self.items else math.inf


@dataclass
class SearchResult:
    ranked: list[Candidate]
    """built, validated and simulated candidates, fastest first (the first is the simulated optimum of
    the enumerated set)"""
    rejected: list[Candidate]
    """the rejected candidates that were built or checked one by one, each with its reason"""
    considered: int
    """candidates bounded (scored without simulation)"""
    simulated: int
    exact: bool
    unfit: int = 0
    """candidates whose memory does not fit (counted by the search-time check, a true lower bound)"""
    collocated: Candidate | None = None
    """the fastest collocated plan (every component on the same devices), the reference of speed-ups"""
    reasons: dict[str, int] = field(default_factory=dict)
    """every rejection by kind of reason (numbers replaced by N): how many"""
    best_rejected: Candidate | None = None
    """the rejected candidate predicted fastest (simulated as if it were allowed), with why it was not"""


Variant = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, Any], ...]]
"""(fusions taken, (setting, value) pairs): what a candidate takes besides its placement."""
Entry = tuple[float, float, float, Shape, Variant, tuple[int, ...], bool]
"""A scored split: (bound per item, bound in seconds, items, shape, variant, parts, fits)."""


class Searcher:
    """Enumerates, bounds, simulates and ranks the candidates of one ``SearchSpace``."""

    def __init__(self, space: SearchSpace, cost: CostModel, devices: int, *, devices_per_node: int | None = None,
                 build_plan: Callable[[PlanChoice], Plan] | None = None, exact_limit: int = 16,
                 cluster_devices: int | None = None, grid: int = 8, starts: int = 2,
                 keep: int | None = 16) -> None:
        self.space, self.cost, self.devices = space, cost, devices
        self.cluster_devices = cluster_devices or devices
        """the cluster's devices; plans use the first ``devices`` of them"""
        self.devices_per_node = devices_per_node or devices
        self.build_plan = build_plan or self._plan_of
        self.exact = devices <= exact_limit
        self.grid, self.starts = grid, starts
        """above ``exact_limit``: splits on multiples of N/``grid``; local search from the ``starts`` best"""
        self.keep = keep
        """above ``exact_limit``: the splits (best by the lead variants' bound) every variant is scored on"""
        self.sim = Simulator(space.graph, space.workload, cost)

    def _plan_of(self, choice: PlanChoice) -> Plan:
        """The Plan of a candidate of a space without a plan function (``candidate_plan.plan_of``)."""
        per_node = min(self.devices_per_node, self.cluster_devices)
        nodes = -(-self.cluster_devices // per_node)
        layout = NodeLayout(tuple(per_node for _ in range(nodes)))
        return plan_of(self.space.graph, self.space.running, self.space.settings, choice, layout,
                       self.space.threads, self.space.offload)

    # -- one candidate -----------------------------------------------------------------------------
    def _hosts(self, fused: Sequence[tuple[str, str]]) -> dict[str, str]:
        hosts = {c: c for c in self.space.running}
        links = dict(fused)
        for c in hosts:
            while hosts[c] in links:
                hosts[c] = links[hosts[c]]
        return hosts

    def _placement(self, shape: Shape, parts: Sequence[int]) -> str:
        if shape.mode == "collocated" and self.devices == self.cluster_devices:
            return "all"
        if shape.mode == "collocated" and self.devices == 1:
            return "local"  # one device of several: every component in the driver, no Ray
        idle = [c for c in self.space.graph.component_names if c not in self.space.running]
        items, lo = [], 0
        last_chain = next((c for c in reversed(self.space.workload.chain) if c in self.space.running), None)
        for block, n in zip(shape.blocks, parts):
            names = list(block) + ([c for c in idle] if last_chain in block else [])
            items.append(f"{','.join(names)}: {lo}-{lo + n - 1}" if n > 1 else f"{','.join(names)}: {lo}")
            lo += n
        if shape.wide is not None:
            names = [shape.wide] + (idle if last_chain == shape.wide else [])
            items.append(f"{','.join(names)}: 0-{self.devices - 1}")
        if shape.inner is not None:
            name, b = shape.inner
            lo, k = sum(parts[:b]), parts[len(shape.blocks)]
            names = [name] + (idle if last_chain == name else [])
            items.append(f"{','.join(names)}: {lo}-{lo + k - 1}" if k > 1 else f"{','.join(names)}: {lo}")
        return ", ".join(items)

    def _setup(self, shape: Shape, parts: Sequence[int], variant: Variant) -> SimSetup:
        blocks, lo = [], 0
        for block, n in zip(shape.blocks, parts):
            blocks.append((block, lo, n))
            lo += n
        if shape.wide is not None:
            blocks.append(((shape.wide,), 0, self.devices))
        if shape.inner is not None:
            name, b = shape.inner
            blocks.append(((name,), sum(parts[:b]), parts[len(shape.blocks)]))
        fused, values = variant
        settings = {**self.space.settings, **dict(values)}
        return build_setup(blocks, self._hosts(fused), settings, holders=self.space.holders, offload=self.space.offload,
                           threads=self.space.threads,
                           devices_per_node=self.devices_per_node if self.cost.cores is not None else None)

    def bound(self, setup: SimSetup) -> float:
        """Lower bound on the iteration time of ``setup`` (see ``bound.FastBound``)."""
        fast = FastBound(self.space.graph, self.space.workload, self.cost, setup,
                         math.ceil(self.devices / self.devices_per_node))
        return fast.evaluate({c: p.ranks for c, p in setup.components.items()})[0]

    def memory(self, setup: SimSetup) -> tuple[dict[str, float], str]:
        """Bytes per device of each device class, and why it does not fit (empty when it does)."""
        ranks = {c: p.ranks for c, p in setup.components.items()}
        return MemoryCheck(setup).evaluate(self.cost, self.sim.call_items(setup), ranks)

    # -- the enumeration ---------------------------------------------------------------------------
    def _variants(self, shape: Shape) -> Iterator[Variant]:
        """(fusions taken, setting values) for every fusion subset and combination of the varied settings."""
        together = {c: i for i, b in enumerate(shape.blocks) for c in b}
        possible = [(c, h) for (c, h) in self.space.fusions
                    if c in together and h in together and together[c] == together[h]]
        names, values = list(self.space.varied), [self.space.varied[k] for k in self.space.varied]
        for n in range(len(possible) + 1):
            for fused in itertools.combinations(possible, n):
                for combo in itertools.product(*values):
                    yield tuple(fused), tuple(zip(names, combo))

    def _inner_sizes(self, n: int) -> list[int]:
        """Devices the inner component may take of its block's ``n``: all fewer (exact), else halvings."""
        if self.exact:
            return list(range(1, n))
        return sorted({max(1, n >> j) for j in range(1, 5)} | {1} - {n})

    def _ranks(self, shape: Shape, parts: Sequence[int]) -> dict[str, int]:
        ranks = {c: parts[i] for i, block in enumerate(shape.blocks) for c in block}
        if shape.wide is not None:
            ranks[shape.wide] = self.devices
        if shape.inner is not None:
            ranks[shape.inner[0]] = parts[len(shape.blocks)]
        return ranks

    def _block_splits(self, m: int, score: Callable[[tuple[int, ...]], float]) -> list[tuple[int, ...]]:
        """Block device counts to try: all (exact); else, of every split on the grid and those the local
        search visits from the ``starts`` best of them (moving N/(2 grid), ..., 1 devices between two blocks
        while ``score`` improves), the ``keep`` best by ``score`` (all when ``keep`` is None)."""
        if self.exact or m == 1:
            return list(compositions(self.devices, m))
        at: dict[tuple[int, ...], float] = {p: score(p) for p in grid_splits(self.devices, m, self.grid)}
        for best in sorted(at, key=at.__getitem__)[:self.starts]:
            step = max(1, self.devices // (2 * self.grid))
            while step >= 1:
                improved = True
                while improved:
                    improved = False
                    for i, j in itertools.permutations(range(m), 2):
                        if best[i] - step < 1:
                            continue
                        p = list(best)
                        p[i] -= step
                        p[j] += step
                        q = tuple(p)
                        if q not in at:
                            at[q] = score(q)
                        if at[q] < at[best] - 1e-12:
                            best, improved = q, True
                step //= 2
        return sorted(at, key=at.__getitem__)[:self.keep]

    def entries(self) -> list[Entry]:
        """Every split and variant scored: (bound per item, bound, items, shape, variant, parts, fits)."""
        out: list[Entry] = []
        for shape in shapes(self.space.running):
            m = len(shape.blocks)
            if m + (shape.inner is not None) > self.devices:
                continue
            variants = list(self._variants(shape))
            p0 = tuple([self.devices - (m - 1)] + [1] * (m - 1))
            if shape.inner is not None:  # the inner component's block needs two devices at least
                b = shape.inner[1]
                p0 = tuple(self.devices - (m - 1) if i == b else 1 for i in range(m))
                p0 += (1,)
            nodes = math.ceil(self.devices / self.devices_per_node)
            evaluators = [FastBound(self.space.graph, self.space.workload, self.cost,
                                    self._setup(shape, p0, variant), nodes) for variant in variants]

            scored: dict[tuple[int, tuple[int, ...]], tuple[float, float, float, bool]] = {}

            def score(v: int, parts: tuple[int, ...]) -> tuple[float, float, float, bool]:
                if (v, parts) not in scored:
                    ranks = self._ranks(shape, parts)
                    fast = evaluators[v]
                    bound, items = fast.evaluate(ranks)
                    fits = fast.fits(ranks)
                    scored[(v, parts)] = ((bound / items if fits else math.inf), bound, items, fits)
                return scored[(v, parts)]

            def with_inner(parts: tuple[int, ...]) -> list[tuple[int, ...]]:
                if shape.inner is None:
                    return [parts]
                return [parts + (k,) for k in self._inner_sizes(parts[shape.inner[1]])]

            # The split search is steered by the best bound of the lead variants: per fusion subset, the
            # setting values best on an even split (every variant, when all visited splits are kept).
            leads = list(range(len(variants)))
            by_fusion_score: dict[tuple[tuple[str, str], ...], float] = {}
            if self.keep is not None and not self.exact:
                even = tuple(max(1, self.devices // m) for _ in range(m - 1))
                even += (self.devices - sum(even),)
                by_fusion: dict[tuple[tuple[str, str], ...], int] = {}
                for v, (fused, _) in enumerate(variants):
                    key = fused
                    at_even = min((score(v, q)[0] for q in with_inner(even)), default=math.inf)
                    if key not in by_fusion or at_even < by_fusion_score[key]:
                        by_fusion[key] = v
                        by_fusion_score[key] = at_even
                leads = sorted(by_fusion.values())

            def best_of(parts: tuple[int, ...]) -> float:
                """The best bound per item of the lead variants and inner sizes on these block counts."""
                return min((score(v, q)[0] for v in leads for q in with_inner(parts)), default=math.inf)

            splits = self._block_splits(m, best_of)
            for v, variant in enumerate(variants):
                for blocks in splits:
                    for parts in with_inner(blocks):
                        key, bound, items, fits = score(v, parts)
                        out.append((key, bound, items, shape, variant, parts, fits))
        return out

    def _candidate(self, entry: Entry) -> Candidate:
        _, bound, items, shape, variant, parts, _ = entry
        setup = self._setup(shape, parts, variant)
        choice = PlanChoice(self._placement(shape, parts), *variant)
        cand = Candidate(shape, parts, choice, bound, setup=setup, items=items)
        cand.memory, cand.rejected = self.memory(setup)
        return cand

    def _materialise(self, cand: Candidate) -> None:
        """Build the candidate's Plan (the workflow's plan function validates plan and config); check its
        memory and simulate it from the Plan."""
        try:
            cand.plan = self.build_plan(cand.choice)
        except ValueError as e:  # PlacementError, PlanError and ConfigError are ValueErrors
            cand.rejected = f"the plan function refused it: {e}"
            return
        cand.setup = setup_from_plan(cand.plan, self.space.holders)
        cand.memory, cand.rejected = self.memory(cand.setup)
        if not cand.rejected:
            cand.result = self.sim.simulate(cand.setup)
            cand.items = self.sim.items(cand.setup)

    def best_first(self, entries: Sequence[Entry], top: int) -> tuple[list[Candidate], list[Candidate], int]:
        """The ``top`` fastest built plans of ``entries`` (``best_first`` over this searcher's alone)."""
        return best_first([(self, e) for e in entries], top)

    def run(self, top: int = 5) -> SearchResult:
        """Bound every candidate, then build and simulate best first (``best_first``) until ``top`` are ranked."""
        return run_searches([self], top)


Scored = tuple["Searcher", Entry]
"""A scored split and the searcher (device count) it belongs to."""


def best_first(entries: Sequence[Scored], top: int) -> tuple[list[Candidate], list[Candidate], int]:
    """The ``top`` fastest built plans of ``entries``: (ranked, rejected on the way, simulated).

    One queue, keyed by what is known of each candidate: its bound (not simulated yet) or its
    simulated time from the search's setup (not built yet); built Plans wait in a second queue,
    keyed by their time simulated from the Plan. A built plan is ranked once no key in the first
    queue is below its time; otherwise the smallest key is taken: a bound is simulated, a simulated
    candidate is built (within ``exact_limit`` devices, where a Plan is cheap, a bound is built and
    simulated from its Plan at once). As bound <= simulated time, the first plan ranked is the
    fastest built plan of the set, whatever ``top`` is; ``top`` only says how many follow it. The
    entries of several device counts share the queue, so a count none of whose bounds can beat the
    plans found is never simulated.
    """
    queue: list[tuple[float, int, int, Any]] = [(e[0], i, 0, (s, e)) for i, (s, e) in enumerate(entries) if e[6]]
    heapq.heapify(queue)
    built: list[tuple[float, int, Candidate, Searcher]] = []
    ranked: list[Candidate] = []
    rejected: list[Candidate] = []
    simulated, order = 0, len(entries)
    while len(ranked) < top and (queue or built):
        if built and (not queue or built[0][0] <= queue[0][0]):
            ranked.append(heapq.heappop(built)[2])
            continue
        _, _, stage, (searcher, item) = heapq.heappop(queue)
        order += 1
        if stage == 0:
            cand = searcher._candidate(item)
            if cand.rejected:
                rejected.append(cand)
                continue
            if searcher.exact:  # small clusters: a Plan is cheap to build, so build it and simulate once
                item = cand
            else:
                assert cand.setup is not None
                cand.result = searcher.sim.simulate(cand.setup)
                simulated += 1
                heapq.heappush(queue, (cand.seconds_per_item, order, 1, (searcher, cand)))
                continue
        searcher._materialise(item)
        simulated += searcher.exact and item.result is not None
        if item.rejected:
            rejected.append(item)
        else:
            heapq.heappush(built, (item.seconds_per_item, order, item, searcher))
    return ranked, rejected, simulated


def run_searches(searchers: Sequence[Searcher], top: int) -> SearchResult:
    """Bound every candidate of every searcher (one per device count), then one best-first pass over all of
    them (``best_first``) until ``top`` are ranked; the fastest collocated plan and the fastest rejected one."""
    entries = [(s, e) for s in searchers for e in s.entries()]
    ranked, rejected, simulated = best_first(entries, top)
    collocated = next((c for c in ranked if c.shape.mode == "collocated"), None)
    if collocated is None:
        found, _, n = best_first([x for x in entries if x[1][3].mode == "collocated"], 1)
        collocated, simulated = (found[0] if found else None), simulated + n
    unfit = [x for x in entries if not x[1][6]]
    reasons: dict[str, int] = {}
    for cand in rejected:
        kind = reason_kind(cand.rejected)
        reasons[kind] = reasons.get(kind, 0) + 1
    if unfit:
        reasons[MEMORY] = reasons.get(MEMORY, 0) + len(unfit)
    log.debug("search: %d candidates bounded, %d simulated", len(entries), simulated)
    return SearchResult(ranked, rejected, len(entries), simulated, all(s.exact for s in searchers), len(unfit),
                        collocated, reasons, _best_rejected(searchers[0].sim, unfit, rejected))


def _best_rejected(sim: Simulator, unfit: Sequence[Scored], rejected: Sequence[Candidate]) -> Candidate | None:
    """The rejected candidate predicted fastest, simulated as if allowed: the unfit one of the lowest bound
    and those refused one by one (``sim``: every searcher's simulator times any device count alike)."""
    pool = list(rejected)
    if unfit:
        searcher, entry = min(unfit, key=lambda x: x[1][1] / x[1][2])
        pool.append(searcher._candidate(entry))
    for cand in pool:
        if cand.result is None and cand.setup is not None:
            cand.result = sim.simulate(cand.setup)
            cand.items = cand.items or sim.items(cand.setup)
    return min(pool, key=lambda c: c.seconds_per_item, default=None)


MEMORY = "memory: needs more than a device has"
"""The reason kind of a candidate whose memory does not fit."""


def reason_kind(reason: str) -> str:
    """A rejection reason without its numbers and device names, to count alike reasons together."""
    if "GiB they have" in reason:
        return MEMORY
    return re.sub(r"\d+(\.\d+)?", "N", reason)


def rejection_summary(result: SearchResult) -> list[str]:
    """Every rejection counted by reason, then the fastest rejected plan and why, one line each."""
    lines = [f"rejected {n}: {kind}" for kind, n in sorted(result.reasons.items(), key=lambda kv: -kv[1])]
    best = result.best_rejected
    if best is not None:
        speed = f"predicted {best.result.iteration_time:.4g} s/iteration, " if best.result is not None else ""
        lead = result.ranked[0].seconds_per_item if result.ranked else None
        than = (f"{best.seconds_per_item / lead:.2f}x the chosen plan's time per item, "
                if lead and best.result is not None else "")
        lines.append(f"fastest rejected: {best.placement!r} ({best.shape.mode}; {speed}{than}"
                     f"{best.choice.describe()}): {best.rejected}")
    return lines


def device_counts(devices: int, cores: int | None, exact_limit: int = 16) -> list[int]:
    """Device counts a search tries: all the cluster's on GPUs; on CPUs, where every process shares the
    node's cores and fewer processes can be faster, also fewer: every count up to ``exact_limit``
    devices, above it halvings of the cluster."""
    if cores is None or devices <= 1:
        return [devices]
    if devices <= exact_limit:
        return list(range(1, devices + 1))
    return sorted({devices} | {max(1, devices >> j) for j in range(1, 5)})


def search(space: SearchSpace, cost: CostModel, devices: int, *, top: int = 5,
           devices_per_node: int | None = None, build_plan: Callable[[PlanChoice], Plan] | None = None,
           exact_limit: int = 16, grid: int = 8, starts: int = 2, keep: int | None = 16) -> SearchResult:
    """Rank the plans of ``space`` on ``devices`` devices by predicted seconds per item (on CPU nodes,
    ``cost.cores`` set, plans on the first 1, 2, ... of them too: see ``device_counts``).

    ``build_plan`` turns a ``PlanChoice`` into its validated Plan (a workflow's ``plan(cfg, layout, choice)``:
    the one builder under the config's constraints and checks; it raises ValueError to refuse); without it,
    ``candidate_plan.plan_of`` builds it from the graph. The Plans returned are the ones that run. Only built, validated Plans are
    ranked (``best_first``).
    """
    counts = device_counts(devices, cost.cores, exact_limit)
    return run_searches([Searcher(space, cost, n, devices_per_node=devices_per_node, build_plan=build_plan,
                                  exact_limit=exact_limit, cluster_devices=devices, grid=grid,
                                  starts=starts, keep=keep) for n in counts], top)
