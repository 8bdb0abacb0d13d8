"""How long a tool call waits before it runs: a stand-in for a tool that answers over a network.

``ToolLatency`` is one distribution of waits, in seconds, drawn from a generator the caller seeds (a
``ToolBox`` seeds it with each episode's seed, so an episode's waits do not depend on where it runs):

- ``uniform``: any time in ``[low_s, max_s]`` alike (the ``[low, high]`` form of ``tool_latency_s``);
- ``lognormal``: ``median_s * exp(sigma * N(0, 1))``; most calls near the median, a few far above it;
- ``pareto``: ``low_s + scale_s * (U ** (-1 / alpha) - 1)``, a power-law tail (smaller ``alpha``, heavier).

The heavy-tailed ones are capped at ``max_s`` (a draw above it waits ``max_s``): a tool whose slowest
calls take about the cap, e.g. ``{dist: lognormal, median_s: 0.02, sigma: 1.5, max_s: 0.5}`` waits
0-500 ms, half its calls under 20 ms, 1.6% at the cap, 53 ms on average, the slowest 5% of calls taking 36%
of all the waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Dist = Literal["uniform", "lognormal", "pareto"]
DISTS: tuple[str, ...] = ("uniform", "lognormal", "pareto")
# The settings each distribution reads (besides ``dist``); anything else in a spec is a mistake.
_KEYS: dict[str, frozenset[str]] = {
    "uniform": frozenset({"low_s", "max_s"}),
    "lognormal": frozenset({"median_s", "sigma", "max_s"}),
    "pareto": frozenset({"low_s", "scale_s", "alpha", "max_s"}),
}


@dataclass(frozen=True)
class ToolLatency:
    """One distribution of a tool call's wait in seconds (see the module docstring for each ``dist``)."""

    dist: Dist = "uniform"
    max_s: float = 0.0
    low_s: float = 0.0
    median_s: float = 0.02
    sigma: float = 1.0
    scale_s: float = 0.01
    alpha: float = 1.5

    def __post_init__(self) -> None:
        if self.dist not in DISTS:
            raise ValueError(f"tool latency dist must be one of {list(DISTS)}, got {self.dist!r}")
        if not 0.0 <= self.low_s <= self.max_s:
            raise ValueError(f"tool latency needs 0 <= low_s <= max_s seconds, got low_s={self.low_s}, "
                             f"max_s={self.max_s}")
        positive = {"lognormal": ("median_s", "sigma"), "pareto": ("scale_s", "alpha")}.get(self.dist, ())
        for name in positive:
            if not getattr(self, name) > 0.0:
                raise ValueError(f"tool latency {self.dist} needs {name} > 0, got {getattr(self, name)}")

    def draw(self, rng: np.random.Generator) -> float:
        """The wait of one call, in ``[low_s, max_s]`` seconds."""
        if self.dist == "uniform":
            return float(rng.uniform(self.low_s, self.max_s))
        if self.dist == "lognormal":
            wait = self.median_s * float(np.exp(self.sigma * rng.standard_normal()))
        else:  # pareto (Lomax shifted to low_s): numpy's pareto draws U ** (-1 / alpha) - 1
            wait = self.low_s + self.scale_s * float(rng.pareto(self.alpha))
        return min(max(wait, self.low_s), self.max_s)


def parse_latency(spec: ToolLatency | Sequence[float] | Mapping[str, Any] | None) -> ToolLatency | None:
    """A latency from its config form: ``[low, high]`` seconds (uniform) or a mapping ``{dist: ..., ...}``
    of ``ToolLatency``'s fields (``max_s`` required); None stays None (calls do not wait)."""
    if spec is None or isinstance(spec, ToolLatency):
        return spec
    if isinstance(spec, Mapping):
        dist = spec.get("dist")
        if dist not in DISTS:
            raise ValueError(f"tool latency dist must be one of {list(DISTS)}, got {dist!r}")
        unknown = sorted(set(spec) - _KEYS[dist] - {"dist"})
        if unknown:
            raise ValueError(f"tool latency {dist} takes {sorted(_KEYS[dist])}, not {unknown}")
        if "max_s" not in spec:
            raise ValueError(f"tool latency {dist} needs max_s (the cap, seconds)")
        return ToolLatency(dist=dist, **{k: float(v) for k, v in spec.items() if k != "dist"})
    if isinstance(spec, (str, bytes)) or len(spec) != 2:
        raise ValueError(f"tool latency must be [low, high] seconds or {{dist: ..., max_s: ...}}, got {spec!r}")
    low, high = (float(x) for x in spec)
    if not 0.0 <= low <= high:
        raise ValueError(f"tool latency [low, high] needs 0 <= low <= high seconds, got {list(spec)}")
    return ToolLatency("uniform", max_s=high, low_s=low)
