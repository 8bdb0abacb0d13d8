"""Resolve a config's placement text into per-component placements and the executor that applies them.

``local`` is the one placement that is not a device map: every component gets one rank on one
device and the local executor runs them all in this process. Anything else is a device map
(``runtime/placement.py``) applied by the Ray executor.
"""

from __future__ import annotations

from collections.abc import Sequence

from m2flow.runtime.placement import NodeLayout, PlacementError, PlacementPlan, parse_placement

LOCAL = "local"


def executor_kind(placement: str) -> str:
    """``local`` for the in-process executor, else ``ray``."""
    return "local" if placement.strip() == LOCAL else "ray"


def resolve_placement(placement: str, layout: NodeLayout, components: Sequence[str]) -> PlacementPlan:
    """Per-component placements for ``placement`` on ``layout``; a bad one raises PlacementError."""
    if executor_kind(placement) == "local":
        return parse_placement(f"{','.join(components)}: 0", NodeLayout((1,)), components)
    if not isinstance(placement, str) or not placement.strip():
        raise PlacementError("empty placement")
    return parse_placement(placement, layout, components)
