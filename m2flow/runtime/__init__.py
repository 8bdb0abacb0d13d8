"""The M2Flow runtime: cluster, placement, workers, communication and channels. Nothing here knows RL.

The names below load on first use (PEP 562), so importing a light module of the runtime (the
placement parser, the errors) does not start importing Ray and torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Cluster": "cluster", "ClusterConfig": "cluster", "NodeInfo": "cluster",
    "DeviceLock": "device_lock", "Offloadable": "device_lock", "device_turn": "device_lock",
    "WorkerDiedError": "errors", "WorkerError": "errors",
    "WorkerGroup": "group", "GroupHandle": "handle",
    "ComponentPlacement": "placement", "NodeLayout": "placement", "PlacementError": "placement",
    "PlacementPlan": "placement", "RankPlacement": "placement", "parse_placement": "placement",
    "Worker": "worker", "WorkerContext": "worker",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'm2flow.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"m2flow.runtime.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
