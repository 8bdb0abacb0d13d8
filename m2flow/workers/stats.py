"""Per-rank metrics of one iteration and how the ranks of a group are combined.

A rank reports means together with ``WEIGHT_KEY``, the number of samples behind them. Names ending
in ``_count`` are totals and add up across ranks; ``time/...`` names are seconds of ranks working
side by side, of which the slowest counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

WEIGHT_KEY = "_weight"
_TOTAL_SUFFIXES = ("_count",)
_TIME_PREFIX = "time/"


def merge_rank_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine the metrics of several ranks: weighted means, summed counts, the longest time."""
    out: dict[str, float] = {}
    total_weight = sum(float(p.get(WEIGHT_KEY, 1.0)) for p in parts)
    keys = sorted({k for p in parts for k in p if k != WEIGHT_KEY})
    for key in keys:
        present = [p for p in parts if key in p]
        if key.endswith(_TOTAL_SUFFIXES):
            out[key] = float(sum(p[key] for p in present))
        elif key.startswith(_TIME_PREFIX):
            out[key] = float(max(p[key] for p in present))
        else:
            weights = [float(p.get(WEIGHT_KEY, 1.0)) for p in present]
            if not sum(weights):  # ranks that saw no samples: a plain mean of what they report
                weights = [1.0] * len(present)
            out[key] = float(sum(w * p[key] for w, p in zip(weights, present)) / sum(weights))
    if total_weight and parts:
        out[WEIGHT_KEY] = total_weight
    return out
