"""Cost model: what each component and each plan decision costs, as documented functions fitted to measurements.

Units everywhere: seconds, bytes, items (an item is the workload's unit of work: a sampled response
in reasoning RL, one environment step of one env in embodied RL).

* Component time: ``t(b, d) = a + c * b / d**alpha + s * log2(d)`` seconds for one unit of work
  of ``b`` items on ``d`` devices (data-parallel ranks working in lockstep). ``a`` is the fixed
  cost of a call (launch), ``c`` the cost of one item on one device, ``alpha`` in (0, 1] how well
  the work scales with devices (1: perfectly), ``s`` the cost of the collectives that grow with
  the ranks (a gradient all-reduce: a tree of log2(d) steps). ``fit_component`` fits ``a, c, s``
  (all >= 0) by least squares on relative error for each ``alpha`` of a grid and keeps the best,
  reporting the relative RMS error.
* Threads (CPUs): the curve holds for a process with ``threads`` torch threads (those of the process
  that measured it). A rank with ``n`` threads takes ``speedup(threads) / speedup(n)`` times as long,
  ``speedup(n) = 1 / ((1 - f) + f / n)`` (Amdahl, ``f = parallel``; 1 unless a point at another thread
  count was measured), so a 2-thread measurement is not credited to 1-thread ranks.
* Component memory per rank: ``m(b, d) = fixed + per_item * b / d`` bytes (weights, optimiser
  state and buffers, then activations / KV cache that split across ranks).
* Transfer on an edge: ``latency + bytes / bandwidth`` between processes. Inside the driver (the
  local executor) an edge between two rank threads hands the object over: ``local_latency`` per
  message, no bytes. The driver's call to a component's processes costs ``dispatch`` (once per
  component and iteration; nothing in the driver). All three are calibrated by the profiler from
  probes that run the same batch fused and unfused (``autoplan/probes.py``).
* Weight sync: a transfer of the source's ``weight_bytes``; offload / onload on shared devices:
  ``state_bytes / offload_bandwidth`` each way of every component the process moves (its own model,
  or the policy fused into env processes), paid when a device lock changes hands.
* Rank threads in the driver (CPUs): torch's OpenMP keeps a team of threads per thread that calls it;
  when the model holders of a local-executor plan run on more than one rank thread, the teams hold
  more threads than there are cores and libgomp stops spinning between parallel regions, so every
  torch op wakes sleeping threads. Each call of a component in ``split_components`` then takes
  ``split_factor`` times its curve (measured by the profiler: the same batch with nothing fused, in
  the driver, against the probes the curves were fitted on; 1 when those already had the holders
  apart, so the curves hold it).
* Processes: the curves are the driver's. A call in a Ray worker process takes ``process_factor``
  times as long (the runtime's own threads share the cores; measured by the profiler: the same batch
  in a Ray process against the driver).
* Start-up: ``startup_s`` per launched group (process start, model build), once per run.
* CPU contention: on a CPU machine a "device" is a slot on cores shared by every process of a
  node. When busy processes demanding ``k`` threads in all run on ``cores`` cores, each runs at
  ``min(1, cores / k)`` of its measured speed (processor sharing; measured times assume the
  process had its threads to itself, on free cores). Beyond the cores a process of more than one
  thread is ``oversubscribed`` times slower still: every torch op ends at a barrier of its thread
  team, which waits for whichever thread has no core (measured by the profiler on ranks whose
  threads exceed the cores; on the 2-core machine such plans run several times slower than sharing
  alone). GPUs have no contention: ``cores`` is None.
* Waiting is not computing: a component's ``cpu_share`` is the part of its busy time its threads
  wanted a core (measured by the profiler); the rest waits (a tool's latency, a remote environment).
  Only that share contends: a busy process of ``threads`` threads and share ``s`` asks the cores for
  ``s * threads`` on average, and a call of ``W`` seconds whose computing runs at speed ``v`` takes
  ``(1 - s) * W + s * W / v``. ``v`` is the same for every process of a node: the largest in (0, 1]
  under which what the busy processes compute fits on the cores,
  ``sum(s_i * threads_i / ((1 - s_i) + s_i / v)) <= cores`` (``CostModel.node_speed``); with every
  share 1 this is the rule above, ``v = min(1, cores / k)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

ALPHA_GRID = tuple(round(0.3 + 0.05 * i, 2) for i in range(15))
"""The scaling exponents tried by ``fit_component``: 0.30, 0.35, ..., 1.00."""


@dataclass(frozen=True)
class ComponentCost:
    """Time and memory of one component as functions of items ``b`` and devices ``d``."""

    a: float = 0.0
    """fixed seconds per call"""
    c: float = 0.0
    """seconds per item on one device"""
    alpha: float = 1.0
    """device scaling exponent, in (0, 1]"""
    s: float = 0.0
    """seconds per doubling of the ranks (collectives)"""
    mem_fixed: float = 0.0
    """bytes per rank whatever the batch (weights, optimiser state)"""
    mem_per_item: float = 0.0
    """bytes per item, split across ranks (activations, KV cache)"""
    state_bytes: float = 0.0
    """bytes moved by an offload or onload (weights, gradients, optimiser state, caches)"""
    weight_bytes: float = 0.0
    """bytes of its model's weights: what a weight sync from it sends (0: ``state_bytes``), and what it shares
    with its host when fused into another model holder (0: all of ``mem_fixed``, as profiles without the
    figure were read)"""
    startup_s: float = 0.0
    """seconds to start the group (once per run)"""
    fit_error: float = 0.0
    """relative RMS error of the fit this came from (0 when entered by hand)"""
    threads: int = 0
    """torch threads of the process the curve was measured in (0: unknown, taken as the plan's)"""
    parallel: float = 1.0
    """fraction of the work that spreads over a process's threads (Amdahl); 1: all of it (the default,
    which never lets a rank with fewer threads than measured run faster per core)"""
    cpu_share: float = 1.0
    """fraction of its busy time its threads want a core (computing, or runnable); the rest waits (a tool's
    latency) and does not contend for the cores. 1: it computes all the time (the default)"""

    def speedup(self, threads: int) -> float:
        """Speed of a process with ``threads`` threads on free cores, relative to one thread."""
        f = min(1.0, max(0.0, self.parallel))
        return 1.0 / ((1.0 - f) + f / max(1, threads))

    def time(self, b: float, d: int, threads: int = 0) -> float:
        """Seconds for one call on ``b`` items over ``d`` devices; ``threads`` (when both it and the
        measured ``self.threads`` are known) rescales from the measured thread count to it."""
        t = self.a + self.c * b / d ** self.alpha + self.s * math.log2(d)
        if threads and self.threads and threads != self.threads:
            t *= self.speedup(self.threads) / self.speedup(threads)
        return t

    def shared_bytes(self) -> float:
        """Bytes of ``mem_fixed`` a copy of the model fused into another holder takes from its host (the
        weights) rather than holding itself: ``weight_bytes`` (at most ``mem_fixed``; 0: all of it)."""
        return min(self.weight_bytes, self.mem_fixed) if self.weight_bytes > 0 else self.mem_fixed

    def memory(self, b: float, d: int) -> float:
        """Bytes per rank for a call on ``b`` items over ``d`` ranks."""
        return self.mem_fixed + self.mem_per_item * b / d


@dataclass(frozen=True)
class Link:
    """A transport between two processes: ``latency + bytes / bandwidth`` seconds."""

    bandwidth: float = 1e9
    """bytes per second"""
    latency: float = 1e-4
    """seconds per message between two processes"""
    local_latency: float = 0.0
    """seconds per message between two rank threads of the driver (the local executor)"""
    dispatch: float | None = None
    """seconds of the driver's call to a component's processes (None: one ``latency``)"""

    def transfer(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth

    def message(self, in_driver: bool) -> float:
        """Seconds per message on an edge between two process groups (rank threads in the driver)."""
        return self.local_latency if in_driver else self.latency

    def call(self, in_driver: bool) -> float:
        """Seconds of the driver's call to a component, once per iteration (nothing in the driver)."""
        if in_driver:
            return 0.0
        return self.latency if self.dispatch is None else self.dispatch


@dataclass(frozen=True)
class CostModel:
    """Everything the simulator needs to time a plan on one machine type."""

    components: Mapping[str, ComponentCost]
    edge_bytes: Mapping[str, float] = field(default_factory=dict)
    """bytes per item carried by each data edge (by graph edge name)"""
    link: Link = Link()
    offload_bandwidth: float = 5e9
    """bytes per second between device and host memory"""
    device_memory: float = math.inf
    """bytes of memory per device; a plan that needs more is rejected"""
    cores: int | None = None
    """cores per node shared by every process (CPU machines); None: devices do not contend"""
    split_factor: float = 1.0
    """time factor of ``split_components``' calls in a driver plan whose model holders run on more than one
    rank thread"""
    split_components: frozenset[str] = frozenset()
    """the components ``split_factor`` applies to (the model holders; their torch work is what slows)"""
    process_factor: float = 1.0
    """time factor of every call in a plan outside the driver (Ray worker processes)"""
    oversubscribed: float = 1.0
    """further slowdown of a busy multi-threaded process while its node's busy threads exceed the cores"""

    def factor(self, name: str, in_driver: bool, hosts: Mapping[str, str]) -> float:
        """The time factor of ``name``'s calls in a plan of these process groups (component -> host)."""
        if not in_driver:
            return self.process_factor
        return self.split_factor if name in self.split_components and self.split_driver(True, hosts) else 1.0

    def split_driver(self, in_driver: bool, hosts: Mapping[str, str]) -> bool:
        """Whether a plan of these process groups (component -> its host) runs the split components on more
        than one rank thread of the driver."""
        return in_driver and apart(hosts, self.split_components)

    def component(self, name: str) -> ComponentCost:
        if name not in self.components:
            raise KeyError(f"the cost model has no component {name!r}; it has {sorted(self.components)}")
        return self.components[name]

    def call_time(self, name: str, b: float, d: int, threads: int = 0) -> float:
        """Seconds of one call of ``name`` on ``b`` items over ``d`` ranks of ``threads`` threads each. On
        CPUs the measured curve is rescaled to the rank's threads; GPUs' times do not depend on them."""
        return self.component(name).time(b, d, threads if self.cores is not None else 0)

    def speed(self, demand: float, threads: int = 1) -> float:
        """Fraction of full speed of a busy process of ``threads`` threads when the busy ones want ``demand``
        threads in all: ``cores / demand`` beyond the cores, and ``oversubscribed`` times slower still for
        a process of more than one thread (its thread team waits at every op for a thread without a core)."""
        if self.cores is None or demand <= self.cores:
            return 1.0
        return self.cores / demand / (self.oversubscribed if threads > 1 else 1.0)

    def node_speed(self, demands: Sequence[tuple[float, float]]) -> float:
        """The speed ``v`` in (0, 1] of the computing of a node's busy processes, given each one's
        ``(threads, cpu_share)``: the largest under which their computing fits on the cores,
        ``sum(s * n / ((1 - s) + s / v)) <= cores`` (a process waiting ``1 - s`` of its time leaves the cores
        to the others meanwhile). With every share 1: ``min(1, cores / sum(n))``."""
        if self.cores is None:
            return 1.0
        wanted = sum(n * s for n, s in demands)
        if wanted <= self.cores:
            return 1.0
        if all(s >= 1.0 for _, s in demands):
            return self.cores / wanted

        def used(v: float) -> float:
            return sum(n * s * v / ((1.0 - s) * v + s) for n, s in demands if s > 0)

        lo, hi = 0.0, 1.0  # used() grows with v; used(1) = wanted > cores
        for _ in range(50):
            mid = (lo + hi) / 2
            if used(mid) > self.cores:
                hi = mid
            else:
                lo = mid
        return lo

    def rate(self, v: float, threads: int, share: float, beyond: bool) -> float:
        """Seconds of work done per second by a busy process of ``threads`` threads and CPU share ``share``
        whose node computes at speed ``v`` (``node_speed``); ``beyond``: the node's demand exceeds the cores,
        so a process of more than one thread is ``oversubscribed`` times slower still in its computing."""
        if self.cores is None:
            return 1.0
        if beyond and threads > 1:
            v /= self.oversubscribed
        share = min(1.0, max(0.0, share))
        return 1.0 / ((1.0 - share) + share / max(v, 1e-12))

    def sync_bytes(self, name: str) -> float:
        """Bytes a weight sync from ``name`` sends."""
        c = self.component(name)
        return c.weight_bytes or c.state_bytes

    def offload_time(self, name: str) -> float:
        """Seconds to move ``name``'s state one way between device and host."""
        return self.component(name).state_bytes / self.offload_bandwidth


def apart(hosts: Mapping[str, str], components: Iterable[str]) -> bool:
    """Whether ``components`` run in more than one process group (``hosts``: component -> its host)."""
    wanted = set(components)
    return len({h for c, h in hosts.items() if c in wanted}) > 1


@dataclass(frozen=True)
class Fit:
    """The result of fitting one component: its cost curve and how well it matches the points."""

    cost: ComponentCost
    error: float
    """relative RMS error over the points: sqrt(mean(((fit - t) / t)**2))"""
    points: int


def _least_squares(rows: Sequence[Sequence[float]], ts: Sequence[float]) -> list[float] | None:
    """Minimise sum(((row . x - t) / t)**2) by the normal equations; None when they are singular."""
    n = len(rows[0])
    w = [1.0 / max(t, 1e-12) ** 2 for t in ts]
    m = [[sum(wi * r[i] * r[j] for wi, r in zip(w, rows)) for j in range(n)] for i in range(n)]
    v = [sum(wi * r[i] * t for wi, r, t in zip(w, rows, ts)) for i in range(n)]
    for col in range(n):  # Gaussian elimination with partial pivoting
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        scale = max(abs(x) for row in m for x in row) or 1.0
        if abs(m[piv][col]) < 1e-12 * scale:
            return None
        m[col], m[piv], v[col], v[piv] = m[piv], m[col], v[piv], v[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            m[r] = [a - f * b for a, b in zip(m[r], m[col])]
            v[r] -= f * v[col]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (v[i] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


def _fit_nonnegative(columns: Sequence[Sequence[float]], ts: Sequence[float]) -> list[float]:
    """Least squares with every coefficient >= 0: the best over subsets of free terms (3 terms: 7 subsets)."""
    best, best_err = [0.0] * len(columns), math.inf
    for k in range(1, len(columns) + 1):
        for subset in itertools.combinations(range(len(columns)), k):
            rows = [[columns[j][i] for j in subset] for i in range(len(ts))]
            x = _least_squares(rows, ts)
            if x is None or min(x) < 0:
                continue
            coef = [0.0] * len(columns)
            for j, xj in zip(subset, x):
                coef[j] = xj
            err = sum(((sum(coef[j] * columns[j][i] for j in range(len(columns))) - t) / t) ** 2
                      for i, t in enumerate(ts))
            if err < best_err - 1e-15:
                best, best_err = coef, err
    return best


def fit_component(points: Iterable[Sequence[float]], alphas: Sequence[float] = ALPHA_GRID,
                  **memory: float) -> Fit:
    """Fit ``t(b, d) = a + c * b / d**alpha + s * log2(d)`` to measured ``(b, d, seconds[, threads])`` points.

    ``alpha`` is taken from ``alphas`` (1.0 alone, and ``s = 0``, when every point has the same
    ``d``: the data cannot tell); ``memory`` passes ``mem_fixed``, ``mem_per_item``, ``state_bytes``, ``startup_s``
    through to the returned cost. A point's ``threads`` are those of the process that measured it: the
    curve is fitted on the points of the most common thread count (its ``threads``), and points at
    other thread counts give ``parallel`` (the mean Amdahl fraction they imply); without such points
    ``parallel`` is 1 (perfect thread scaling). A point at another thread count on a device count the
    main points lack (ranks probed at fewer threads to fit on the cores) is carried over to the main
    threads under that fraction, and the curve is fitted again with it.
    """
    raw = [tuple(p) for p in points]
    if not raw:
        raise ValueError("fit_component needs at least one (items, devices, seconds) point")
    if any(len(p) not in (3, 4) for p in raw):
        raise ValueError(f"points are (items, devices, seconds) or (items, devices, seconds, threads): {raw}")
    pts4 = [(float(p[0]), int(p[1]), float(p[2]), int(p[3]) if len(p) == 4 else 0) for p in raw]
    if any(t <= 0 or b < 0 or d < 1 or n < 0 for b, d, t, n in pts4):
        raise ValueError(f"points need items >= 0, devices >= 1, seconds > 0 and threads >= 0: {raw}")
    counts: dict[int, int] = {}
    for *_, n in pts4:
        counts[n] = counts.get(n, 0) + 1
    main = max(counts, key=lambda n: (counts[n], n))
    pts = [(b, d, t) for b, d, t, n in pts4 if n == main]
    one_d = len({d for _, d, _ in pts}) == 1
    if one_d:
        alphas = (1.0,)
    best: Fit | None = None
    ts = [t for _, _, t in pts]
    for alpha in alphas:
        columns = [[1.0] * len(pts), [b / d ** alpha for b, d, _ in pts]]
        if not one_d:
            columns.append([math.log2(d) for _, d, _ in pts])
        coef = _fit_nonnegative(columns, ts) + [0.0]
        a, c, s = coef[0], coef[1], coef[2]
        cost = ComponentCost(a, c, alpha, s, **memory, threads=main)
        err = math.sqrt(sum(((cost.time(b, d) - t) / t) ** 2 for b, d, t in pts) / len(pts))
        if best is None or err < best.error - 1e-12:
            best = Fit(cost, err, len(pts))
    assert best is not None
    cost = best.cost
    # Points at other thread counts: those on a device count the main points have give ``parallel``
    # (the Amdahl fraction they imply); then every point at another count is carried over to the main
    # threads under it, and the curve is fitted again on all of them (a rank count probed only at fewer
    # threads, for its ranks to fit on the cores, then shapes ``alpha`` and ``s``).
    main_d = {d for _, d, _ in pts}
    fractions = [_amdahl(t / cost.time(b, d), main, n) for b, d, t, n in pts4
                 if n and main and n != main and d in main_d]
    if fractions:
        cost = replace(cost, parallel=sum(fractions) / len(fractions))
    carried = [(b, d, t * cost.speedup(n) / cost.speedup(main)) for b, d, t, n in pts4
               if n and main and n != main and d not in main_d]
    if carried:
        refit = fit_component([*pts, *carried], alphas, **memory)
        cost = replace(refit.cost, threads=main, parallel=cost.parallel)
    err = math.sqrt(sum(((cost.time(b, d, n) - t) / t) ** 2 for b, d, t, n in pts4) / len(pts4))
    return Fit(replace(cost, fit_error=err), err, len(pts4))


def _amdahl(ratio: float, measured: int, other: int) -> float:
    """The parallel fraction f, in [0, 1], under which a process of ``other`` threads takes ``ratio``
    times as long as one of ``measured`` threads: ``ratio = ((1-f) + f/other) / ((1-f) + f/measured)``."""
    den = ratio * (1.0 - 1.0 / measured) - (1.0 - 1.0 / other)
    if abs(den) < 1e-12:
        return 1.0
    return min(1.0, max(0.0, (ratio - 1.0) / den))
