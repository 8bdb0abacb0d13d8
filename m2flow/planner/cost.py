"""Cost model: what each component and each plan decision costs, as documented functions fitted to measurements.

Units everywhere: seconds, bytes, items (an item is the workload's unit of work: a sampled response
in reasoning RL, one environment step of one env in embodied RL).

* Component time: ``t(b, d) = a + c * b / d**alpha`` seconds for one unit of work of ``b`` items
  on ``d`` devices (data-parallel ranks working in lockstep). ``a`` is the fixed cost of a call
  (launch, synchronisation), ``c`` the cost of one item on one device, ``alpha`` in (0, 1] how
  well the work scales with devices (1: perfectly). ``fit_component`` fits ``a, c`` by least
  squares for each ``alpha`` of a grid and keeps the best, reporting the relative RMS error.
* Component memory per rank: ``m(b, d) = fixed + per_item * b / d`` bytes (weights, optimiser
  state and buffers, then activations / KV cache that split across ranks).
* Transfer on an edge: ``latency + bytes / bandwidth``; nothing inside one process.
* Weight sync: a transfer of the source's ``state_bytes``; offload / onload on shared devices:
  ``state_bytes / offload_bandwidth`` each way, paid when a device lock changes hands.
* Start-up: ``startup_s`` per launched group (process start, model build), once per run.
* CPU contention: on a CPU machine a "device" is a slot on cores shared by every process of a
  node. When busy processes demanding ``k`` threads in all run on ``cores`` cores, each runs at
  ``min(1, cores / k)`` of its measured speed (processor sharing; measured times assume the
  process had its threads to itself). GPUs have no contention: ``cores`` is None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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
    mem_fixed: float = 0.0
    """bytes per rank whatever the batch (weights, optimiser state)"""
    mem_per_item: float = 0.0
    """bytes per item, split across ranks (activations, KV cache)"""
    state_bytes: float = 0.0
    """bytes moved by an offload or onload, and by a weight sync sent from this component"""
    startup_s: float = 0.0
    """seconds to start the group (once per run)"""
    fit_error: float = 0.0
    """relative RMS error of the fit this came from (0 when entered by hand)"""

    def time(self, b: float, d: int) -> float:
        """Seconds for one call on ``b`` items over ``d`` devices."""
        return self.a + self.c * b / d ** self.alpha

    def memory(self, b: float, d: int) -> float:
        """Bytes per rank for a call on ``b`` items over ``d`` ranks."""
        return self.mem_fixed + self.mem_per_item * b / d


@dataclass(frozen=True)
class Link:
    """A transport between two processes: ``latency + bytes / bandwidth`` seconds."""

    bandwidth: float = 1e9
    """bytes per second"""
    latency: float = 1e-4
    """seconds per message"""

    def transfer(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


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

    def component(self, name: str) -> ComponentCost:
        if name not in self.components:
            raise KeyError(f"the cost model has no component {name!r}; it has {sorted(self.components)}")
        return self.components[name]

    def speed(self, demand: float) -> float:
        """Fraction of full speed of each busy process when the busy ones want ``demand`` threads in all."""
        if self.cores is None or demand <= self.cores:
            return 1.0
        return self.cores / demand

    def offload_time(self, name: str) -> float:
        """Seconds to move ``name``'s state one way between device and host."""
        return self.component(name).state_bytes / self.offload_bandwidth


@dataclass(frozen=True)
class Fit:
    """The result of fitting one component: its cost curve and how well it matches the points."""

    cost: ComponentCost
    error: float
    """relative RMS error over the points: sqrt(mean(((fit - t) / t)**2))"""
    points: int


def _solve_ac(rows: Sequence[tuple[float, float]], ts: Sequence[float]) -> tuple[float, float]:
    """Weighted least squares for ``t = a + c * x`` with weights 1/t**2 (relative error), a, c >= 0."""
    w = [1.0 / max(t, 1e-12) ** 2 for t in ts]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, rows))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, rows))
    st = sum(wi * t for wi, t in zip(w, ts))
    sxt = sum(wi * x * t for wi, (x, _), t in zip(w, rows, ts))
    det = sw * sxx - sx * sx
    if abs(det) < 1e-18 * max(1.0, sw * sxx):  # one distinct x: all cost is per item
        return 0.0, max(0.0, st / sx) if sx else 0.0
    a = (sxx * st - sx * sxt) / det
    c = (sw * sxt - sx * st) / det
    if a < 0:  # refit through the origin
        return 0.0, max(0.0, sxt / sxx)
    if c < 0:
        return st / sw, 0.0
    return a, c


def fit_component(points: Iterable[tuple[float, int, float]], alphas: Sequence[float] = ALPHA_GRID,
                  **memory: float) -> Fit:
    """Fit ``t(b, d) = a + c * b / d**alpha`` to measured ``(b, d, seconds)`` points.

    ``alpha`` is taken from ``alphas`` (1.0 alone when every point has the same ``d``: the data
    cannot tell); ``memory`` passes ``mem_fixed``, ``mem_per_item``, ``state_bytes``, ``startup_s``
    through to the returned cost.
    """
    pts = [(float(b), int(d), float(t)) for b, d, t in points]
    if not pts:
        raise ValueError("fit_component needs at least one (items, devices, seconds) point")
    if any(t <= 0 or b < 0 or d < 1 for b, d, t in pts):
        raise ValueError(f"points need items >= 0, devices >= 1 and seconds > 0: {pts}")
    if len({d for _, d, _ in pts}) == 1:
        alphas = (1.0,)
    best: Fit | None = None
    ts = [t for _, _, t in pts]
    for alpha in alphas:
        xs = [(b / d ** alpha, 0.0) for b, d, _ in pts]
        a, c = _solve_ac(xs, ts)
        err = math.sqrt(sum(((a + c * x - t) / t) ** 2 for (x, _), t in zip(xs, ts)) / len(pts))
        if best is None or err < best.error - 1e-12:
            best = Fit(ComponentCost(a, c, alpha, fit_error=err, **memory), err, len(pts))
    assert best is not None
    return best
