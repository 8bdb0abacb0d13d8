"""Drift between a running plan's measured component times and what its profile predicted.

``DriftDetector`` is fed, once per iteration, the seconds each component was busy; it compares
them with the predicted busy seconds of the plan (the simulator's ``component_time``). A
component drifts when the median of its measured / predicted ratios over the last ``window``
iterations lies outside ``[1 / (1 + threshold), 1 + threshold]``. The median makes it sustained:
one slow iteration (a garbage collection, a neighbour's burst) moves it not at all, and noise
that stays inside the band never triggers, however long the run. The first ``warmup`` iterations
(compilation, caches filling) are not counted.

``rescaled`` turns the ratios into a corrected cost model (every time term of a drifting
component scaled by its ratio), and ``worth_switching`` weighs the predicted gain of another
plan over the remaining iterations against the cost of switching to it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from m2flow.planner.cost import CostModel

_MIN_SECONDS = 1e-6
"""Predicted busy times below this are not compared (a component that does next to nothing)."""


@dataclass(frozen=True)
class Drift:
    """A component whose measured time has left the band around its prediction."""

    component: str
    ratio: float
    """median measured / predicted over the window"""
    iteration: int
    """the iteration (counted from 0 since the detector started) at which the window first drifted"""

    def describe(self, window: int) -> str:
        return (f"{self.component} took {self.ratio:.2f}x its predicted time (median of the last {window} "
                "iterations)")


class DriftDetector:
    """Sustained drift of measured component times from predicted ones (see the module docstring)."""

    def __init__(self, predicted: Mapping[str, float], threshold: float = 0.5, window: int = 4,
                 warmup: int = 1) -> None:
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold}")
        if window < 1 or warmup < 0:
            raise ValueError(f"window must be >= 1 and warmup >= 0, got {window} and {warmup}")
        self.predicted = {c: float(t) for c, t in predicted.items() if t > _MIN_SECONDS}
        self.threshold, self.window, self.warmup = threshold, window, warmup
        self._ratios: dict[str, deque[float]] = {c: deque(maxlen=window) for c in self.predicted}
        self.seen = 0
        self.drifts: dict[str, Drift] = {}
        """the components drifting now, with the iteration they started drifting at"""

    def observe(self, measured: Mapping[str, float]) -> list[Drift]:
        """Record one iteration's busy seconds per component; returns the drifts that began with it."""
        it = self.seen
        self.seen += 1
        if it < self.warmup:
            return []
        started = []
        for c, predicted in self.predicted.items():
            if c not in measured or not math.isfinite(measured[c]) or measured[c] < 0:
                continue
            self._ratios[c].append(max(measured[c], _MIN_SECONDS) / predicted)
            ratio = self.ratio(c)
            if ratio is not None and not 1 / (1 + self.threshold) <= ratio <= 1 + self.threshold:
                if c not in self.drifts:
                    self.drifts[c] = Drift(c, ratio, it)
                    started.append(self.drifts[c])
                else:
                    self.drifts[c] = replace(self.drifts[c], ratio=ratio)
            else:
                self.drifts.pop(c, None)
        return started

    def ratio(self, component: str) -> float | None:
        """Median measured / predicted of a full window (None until the window is full)."""
        window = self._ratios.get(component)
        if window is None or len(window) < self.window:
            return None
        return statistics.median(window)

    def ratios(self) -> dict[str, float]:
        """Median ratio of every component with a full window (drifting or not)."""
        out = {c: self.ratio(c) for c in self.predicted}
        return {c: r for c, r in out.items() if r is not None}

    @property
    def drifting(self) -> bool:
        return bool(self.drifts)


def rescaled(cost: CostModel, ratios: Mapping[str, float]) -> CostModel:
    """``cost`` with the time terms (a, c, s) of each component in ``ratios`` multiplied by its ratio."""
    comps = dict(cost.components)
    for c, r in ratios.items():
        if c in comps:
            k = comps[c]
            comps[c] = replace(k, a=k.a * r, c=k.c * r, s=k.s * r)
    return replace(cost, components=comps)


@dataclass(frozen=True)
class SwitchDecision:
    """Whether to leave the running plan for another: the gain over the rest of the run against the switch."""

    switch: bool
    gain_s: float
    """predicted seconds saved over the remaining iterations"""
    cost_s: float
    """predicted seconds the switch costs (stopping, restarting the groups, reloading the checkpoint)"""

    def describe(self) -> str:
        verdict = "switching" if self.switch else "keeping the plan"
        return f"predicted gain {self.gain_s:.1f}s over the rest of the run vs {self.cost_s:.1f}s to switch: {verdict}"


def worth_switching(current_s: float, best_s: float, remaining_iterations: int, switch_cost_s: float
                    ) -> SwitchDecision:
    """Switch when ``(current_s - best_s) * remaining_iterations`` exceeds ``switch_cost_s`` (seconds per
    iteration of the running plan and of the best other plan, both under the corrected cost model)."""
    gain = max(0.0, current_s - best_s) * max(0, remaining_iterations)
    return SwitchDecision(gain > switch_cost_s, gain, switch_cost_s)
