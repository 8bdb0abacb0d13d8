"""Resolve a config's placement text into per-component placements, and name the executor that applies them.

``local`` (``runtime.placement.LOCAL``) is every component on device 0, one rank each, run by the
local executor in this process; any other placement is a device map run by the Ray executor.
"""

from __future__ import annotations

from collections.abc import Sequence

from m2flow.runtime.placement import LOCAL, NodeLayout, PlacementPlan, parse_placement


def executor_kind(placement: str) -> str:
    """``local`` for the in-process executor, else ``ray`` (``runtime.executors.make_executor`` agrees)."""
    return "local" if placement.strip() == LOCAL else "ray"


def resolve_placement(placement: str, layout: NodeLayout, components: Sequence[str]) -> PlacementPlan:
    """Per-component placements for ``placement`` on ``layout``; a bad one raises PlacementError."""
    return parse_placement(placement, layout, components)
