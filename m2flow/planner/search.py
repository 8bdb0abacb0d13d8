"""Search the execution plans of a workflow on N devices for the one the simulator predicts fastest.

Candidates: every way to place the running components, which is a *shape* (the components split
into blocks on disjoint device ranges; optionally one component spanning all devices over them,
the hybrid mode; one block is the collocated mode) times a device count per block, times every
fusion the graph allows where component and host share devices, times the values of each searched
setting (pipeline stages, micro-batch sizes). Each candidate is a placement string plus config
overrides, so a Plan is only ever built by the workflow's own plan function.

Scoring: seconds per item of a simulated steady iteration (``Simulator``), which is iteration time
when the items per iteration are fixed. Every candidate first gets a cheap lower bound on its
iteration time (the busiest process group or device lock: work there runs one call at a time);
candidates are simulated in order of bound and the search stops once the next bound cannot beat
the best simulated time (branch and bound), so the result is the simulated optimum of the
enumerated set. A candidate whose memory per device exceeds the device's is rejected with why.

Device counts: exhaustive (every composition of N) up to ``exact_limit`` devices. Above it, splits
start on a grid of eighths of N and are refined by moving N/16, N/32, ..., 1 devices between two
blocks while the bound improves (a local search, about m^2 log N bounds for m blocks). Its gap to
exhaustive is measured by ``benchmarks/s2_planner_scale.py`` where both run.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from m2flow.planner.bound import FastBound
from m2flow.planner.cost import CostModel
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.plan import Plan
from m2flow.planner.setup import SimSetup, Workload, build_setup, setup_from_plan
from m2flow.planner.simulate import SimResult, Simulator

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
    knobs: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """config key -> the values to try"""
    knob_settings: Mapping[str, str] = field(default_factory=dict)
    """config key -> the plan setting it becomes (for candidates scored before a Plan exists)"""
    fusion_keys: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(component, host) -> the boolean config key that asks for the fusion"""
    threads: Mapping[str, int] = field(default_factory=dict)

    @property
    def holders(self) -> tuple[str, ...]:
        return tuple(c for c in self.running if self.graph.component(c).holds_model)


@dataclass(frozen=True)
class Shape:
    """Blocks of components on disjoint device ranges; possibly one more component over all of them
    (``wide``) or on the first devices of one block (``inner``: component, block index)."""

    blocks: tuple[tuple[str, ...], ...]
    wide: str | None = None
    inner: tuple[str, int] | None = None

    @property
    def mode(self) -> str:
        if self.wide is not None or self.inner is not None:
            return "hybrid"
        return "collocated" if len(self.blocks) == 1 else "disaggregated"


@dataclass
class Candidate:
    """One plan the search considered: how to ask for it, and what it is predicted to do."""

    shape: Shape
    parts: tuple[int, ...]
    """devices of each block (then of the inner component, if the shape has one)"""
    overrides: dict[str, Any]
    """config overrides that ask for it (``placement`` among them)"""
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
        return str(self.overrides["placement"])

    @property
    def seconds_per_item(self) -> float:
        return self.result.iteration_time / self.items if self.result and self.items else math.inf


@dataclass
class SearchResult:
    ranked: list[Candidate]
    """simulated candidates, fastest first"""
    rejected: list[Candidate]
    considered: int
    """candidates bounded (scored without simulation)"""
    simulated: int
    exact: bool
    unfit: int = 0
    """candidates whose memory does not fit (the first few are in ``rejected``, with the reason)"""
    collocated: Candidate | None = None
    """the fastest collocated plan (every component on the same devices), the reference of speed-ups"""


def set_partitions(items: Sequence[str]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition of ``items`` into blocks, blocks in order of their first item."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield ((first,),) + part
        for i in range(len(part)):
            yield part[:i] + ((first,) + part[i],) + part[i + 1:]


def shapes(running: Sequence[str]) -> list[Shape]:
    """Collocated, every disaggregated split, and the hybrids: one component over the others' blocks,
    or one component on part of one block's devices (e.g. the actor on one of the env ranks' devices)."""
    out = [Shape(tuple(p)) for p in set_partitions(list(running))]
    for one in running:
        rest = [c for c in running if c != one]
        for p in set_partitions(rest):
            if len(p) >= 2:
                out.append(Shape(tuple(p), wide=one))
            out += [Shape(tuple(p), inner=(one, b)) for b in range(len(p))]
    return out


def compositions(n: int, m: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``n`` as ``m`` positive parts, in order."""
    for cuts in itertools.combinations(range(1, n), m - 1):
        yield tuple(b - a for a, b in zip((0,) + cuts, cuts + (n,)))


def _grid(n: int, m: int) -> list[tuple[int, ...]]:
    """Splits of ``n`` into ``m`` parts that are multiples of n/8 (the coarse start of the local search)."""
    unit = max(1, n // 8)
    whole = n // unit
    return [tuple(p * unit for p in c[:-1]) + (n - unit * sum(c[:-1]),) for c in compositions(whole, m)]


Entry = tuple[float, float, float, Shape, list[tuple[str, str]], dict[str, Any], tuple[int, ...], bool]
"""A scored split: (bound per item, bound in seconds, items, shape, fusions taken, overrides, parts, fits)."""


class Searcher:
    """Enumerates, bounds, simulates and ranks the candidates of one ``SearchSpace``."""

    def __init__(self, space: SearchSpace, cost: CostModel, devices: int, *, devices_per_node: int | None = None,
                 build_plan: Callable[[Mapping[str, Any]], Plan] | None = None, exact_limit: int = 16,
                 cluster_devices: int | None = None) -> None:
        self.space, self.cost, self.devices = space, cost, devices
        self.cluster_devices = cluster_devices or devices
        """the cluster's devices; plans use the first ``devices`` of them"""
        self.devices_per_node = devices_per_node or devices
        self.build_plan = build_plan
        self.exact = devices <= exact_limit
        self.sim = Simulator(space.graph, space.workload, cost)

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

    def _setup(self, shape: Shape, parts: Sequence[int], fused: Sequence[tuple[str, str]],
               knobs: Mapping[str, Any]) -> SimSetup:
        blocks, lo = [], 0
        for block, n in zip(shape.blocks, parts):
            blocks.append((block, lo, n))
            lo += n
        if shape.wide is not None:
            blocks.append(((shape.wide,), 0, self.devices))
        if shape.inner is not None:
            name, b = shape.inner
            blocks.append(((name,), sum(parts[:b]), parts[len(shape.blocks)]))
        settings = dict(self.space.settings)
        settings.update({self.space.knob_settings[k]: v for k, v in knobs.items() if k in self.space.knob_settings})
        return build_setup(blocks, self._hosts(fused), settings, holders=self.space.holders,
                           threads=self.space.threads,
                           devices_per_node=self.devices_per_node if self.cost.cores is not None else None)

    def bound(self, setup: SimSetup) -> float:
        """Lower bound on the iteration time of ``setup`` (see ``bound.FastBound``)."""
        fast = FastBound(self.space.graph, self.space.workload, self.cost, setup,
                         math.ceil(self.devices / self.devices_per_node))
        return fast.evaluate({c: p.ranks for c, p in setup.components.items()})[0]

    def memory(self, setup: SimSetup) -> tuple[dict[str, float], str]:
        """Bytes per device of each device class, and why it does not fit (empty when it does)."""
        need = self.sim.call_items(setup)
        out, why = {}, ""
        for k in setup.classes:
            parts = {c: self.cost.component(c).memory(need[c], setup.components[c].ranks) * k.ranks_per_device[c]
                     for c in sorted(k.members)}
            # Components that offload take turns on the memory too: only the largest is resident.
            turns = [v for c, v in parts.items() if setup.components[c].offload]
            total = sum(v for c, v in parts.items() if not setup.components[c].offload) + max(turns, default=0.0)
            out[k.label] = total
            if total > self.cost.device_memory and not why:
                detail = ", ".join(f"{c} {v / 2**30:.1f}" for c, v in parts.items())
                why = (f"devices {k.label} need {total / 2**30:.1f} GiB each ({detail}), more than the "
                       f"{self.cost.device_memory / 2**30:.1f} GiB they have")
        return out, why

    # -- the enumeration ---------------------------------------------------------------------------
    def _variants(self, shape: Shape) -> Iterator[tuple[list[tuple[str, str]], dict[str, Any]]]:
        """(fusions taken, config overrides) for every fusion subset and knob value combination."""
        together = {c: i for i, b in enumerate(shape.blocks) for c in b}
        possible = [(c, h) for (c, h) in self.space.fusion_keys
                    if c in together and h in together and together[c] == together[h]]
        keys, values = list(self.space.knobs), [self.space.knobs[k] for k in self.space.knobs]
        for n in range(len(possible) + 1):
            for fused in itertools.combinations(possible, n):
                flags = {key: (pair in fused) for pair, key in self.space.fusion_keys.items()}
                for combo in itertools.product(*values):
                    yield list(fused), {**flags, **dict(zip(keys, combo))}

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
        """Block device counts to try: all (exact), else the eighths grid refined by local search on ``score``."""
        if self.exact or m == 1:
            return list(compositions(self.devices, m))
        seen: dict[tuple[int, ...], float] = {p: score(p) for p in _grid(self.devices, m)}
        best = min(seen, key=seen.__getitem__)
        step = max(1, self.devices // 16)
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
                    if q not in seen:
                        seen[q] = score(q)
                    if seen[q] < seen[best] - 1e-12:
                        best, improved = q, True
            step //= 2
        return sorted(seen, key=seen.__getitem__)[:3]

    def entries(self) -> list[Entry]:
        """Every split and variant scored: (bound per item, bound, items, shape, fusions, overrides, parts, fits)."""
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
                                    self._setup(shape, p0, fused, knobs), nodes) for fused, knobs in variants]

            scored: dict[tuple[int, tuple[int, ...]], tuple[float, float, float, bool]] = {}

            def score(v: int, parts: tuple[int, ...]) -> tuple[float, float, float, bool]:
                if (v, parts) not in scored:
                    ranks = self._ranks(shape, parts)
                    fast = evaluators[v]
                    bound, items = fast.evaluate(ranks)
                    fits = not fast.memory(ranks)[1]
                    scored[(v, parts)] = ((bound / items if fits else math.inf), bound, items, fits)
                return scored[(v, parts)]

            def with_inner(v: int, parts: tuple[int, ...]) -> list[tuple[int, ...]]:
                if shape.inner is None:
                    return [parts]
                return [parts + (k,) for k in self._inner_sizes(parts[shape.inner[1]])]

            def best_of(v: int, parts: tuple[int, ...]) -> float:
                return min((score(v, q)[0] for q in with_inner(v, parts)), default=math.inf)

            if self.exact:
                splits = self._block_splits(m, lambda p: 0.0)
            else:  # one variant steers the split; every variant is then scored on the best splits
                start = tuple(max(1, self.devices // m) for _ in range(m - 1))
                start += (self.devices - sum(start),)
                lead = min(range(len(variants)), key=lambda v: best_of(v, start))
                splits = self._block_splits(m, lambda p: best_of(lead, p))
            for v in range(len(variants)):
                fused, knobs = variants[v]
                for blocks in splits:
                    for parts in with_inner(v, blocks):
                        key, bound, items, fits = score(v, parts)
                        out.append((key, bound, items, shape, fused, knobs, parts, fits))
        return out

    def _candidate(self, entry: Entry) -> Candidate:
        _, bound, items, shape, fused, knobs, parts, _ = entry
        setup = self._setup(shape, parts, fused, knobs)
        cand = Candidate(shape, parts, {"placement": self._placement(shape, parts), **knobs}, bound, setup=setup,
                         items=items)
        cand.memory, cand.rejected = self.memory(setup)
        return cand

    def _materialise(self, cand: Candidate) -> None:
        """Build the candidate's Plan with the workflow's own plan function; simulate from it."""
        if self.build_plan is None:
            return
        try:
            cand.plan = self.build_plan(cand.overrides)
        except ValueError as e:  # PlacementError and PlanError are ValueErrors
            cand.rejected = f"the plan function refused it: {e}"
            return
        cand.setup = setup_from_plan(cand.plan)
        cand.memory, cand.rejected = self.memory(cand.setup)

    def run(self, top: int = 5, keep_rejected: int = 20) -> SearchResult:
        """Bound every candidate, simulate in bound order until no bound can win, rank the simulated."""
        entries = self.entries()
        entries.sort(key=lambda e: e[0])
        unfit = [e for e in entries if not e[7]]
        rejected = [self._candidate(e) for e in unfit[:keep_rejected]]
        ranked: list[Candidate] = []
        best: list[float] = []  # max-heap (negated) of the top seconds per item simulated so far
        for entry in entries:
            if not entry[7]:
                break  # the unfit sort last (their key is infinite)
            if len(best) >= top and entry[0] > -best[0] * (1 + 1e-9):
                break
            cand = self._candidate(entry)
            if self.exact:
                self._materialise(cand)
            if cand.rejected:
                if len(rejected) < keep_rejected:
                    rejected.append(cand)
                continue
            assert cand.setup is not None
            cand.result = self.sim.simulate(cand.setup)
            cand.items = self.sim.items(cand.setup)
            ranked.append(cand)
            heapq.heappush(best, -cand.seconds_per_item)
            if len(best) > top:
                heapq.heappop(best)
        ranked.sort(key=lambda c: c.seconds_per_item)
        if not self.exact:  # the plan function has the last word on the ones shown
            for cand in ranked[:top]:
                self._materialise(cand)
                if cand.plan is not None and not cand.rejected:
                    cand.result = self.sim.simulate(cand.setup)  # type: ignore[arg-type]
            rejected += [c for c in ranked[:top] if c.rejected]
            ranked = [c for c in ranked if not c.rejected]
            ranked.sort(key=lambda c: c.seconds_per_item)
        log.debug("search: %d candidates bounded, %d simulated", len(entries), len(ranked))
        return SearchResult(ranked, rejected, len(entries), len(ranked), self.exact, len(unfit),
                            self._best_collocated(entries, ranked))

    def _best_collocated(self, entries: list[Entry], ranked: list[Candidate]) -> Candidate | None:
        """The fastest collocated candidate: among the ranked, else simulated now (a few variants)."""
        done = [c for c in ranked if c.shape.mode == "collocated"]
        if done:
            return done[0]
        found = []
        for entry in (e for e in entries if e[3].mode == "collocated" and e[7]):
            cand = self._candidate(entry)
            if not cand.rejected and cand.setup is not None:
                cand.result = self.sim.simulate(cand.setup)
                found.append(cand)
        return min(found, key=lambda c: c.seconds_per_item, default=None)


def device_counts(devices: int, cores: int | None, exact_limit: int = 16) -> list[int]:
    """Device counts a search tries: all the cluster's on GPUs; on CPUs, where every process shares the
    node's cores and fewer processes can be faster, also fewer: every count up to ``exact_limit``
    devices, above it halvings of the cluster."""
    if cores is None or devices <= 1:
        return [devices]
    if devices <= exact_limit:
        return list(range(1, devices + 1))
    return sorted({devices} | {max(1, devices >> j) for j in range(1, 5)})


def merge_results(results: Sequence[SearchResult], keep_rejected: int = 20) -> SearchResult:
    """One ranking of the searches of several device counts (each the simulated optimum of its own set)."""
    ranked = sorted((c for r in results for c in r.ranked), key=lambda c: c.seconds_per_item)
    collocated = [r.collocated for r in results if r.collocated is not None]
    return SearchResult(ranked, [c for r in results for c in r.rejected][:keep_rejected],
                        sum(r.considered for r in results), sum(r.simulated for r in results),
                        all(r.exact for r in results), sum(r.unfit for r in results),
                        min(collocated, key=lambda c: c.seconds_per_item, default=None))


def search(space: SearchSpace, cost: CostModel, devices: int, *, top: int = 5,
           devices_per_node: int | None = None, plan_fn: Callable[[Any, Any], Plan] | None = None,
           configure: Callable[[Mapping[str, Any]], Any] | None = None, layout: Any = None,
           exact_limit: int = 16) -> SearchResult:
    """Rank the plans of ``space`` on ``devices`` devices by predicted seconds per item (on CPU nodes,
    ``cost.cores`` set, plans on the first 1, 2, ... of them too: see ``device_counts``).

    With ``plan_fn`` and ``configure`` (config overrides -> config), candidates become Plans through
    ``plan_fn(configure(overrides), layout)``: every simulated one on small clusters, the top ones on
    large clusters; without them, candidates are scored from their placements alone.
    """
    build: Callable[[Mapping[str, Any]], Plan] | None = None
    if plan_fn is not None and configure is not None:
        make_plan, make_cfg = plan_fn, configure

        def _build(overrides: Mapping[str, Any]) -> Plan:
            return make_plan(make_cfg(overrides), layout)

        build = _build
    counts = device_counts(devices, cost.cores, exact_limit)
    return merge_results([Searcher(space, cost, n, devices_per_node=devices_per_node, build_plan=build,
                                   exact_limit=exact_limit, cluster_devices=devices).run(top) for n in counts])
