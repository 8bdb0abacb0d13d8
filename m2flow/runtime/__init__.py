"""The M2Flow runtime: cluster, placement, workers, communication and channels. Nothing here knows RL.

The names below load on first use (PEP 562), so importing a light module of the runtime (the
placement parser, the errors) does not start importing Ray and torch.
"""

from __future__ import annotations

from m2flow.lazy import lazy_names

_WHERE = {
    "Cluster": "cluster", "ClusterConfig": "cluster", "NodeInfo": "cluster",
    "DeviceLock": "device_lock", "Offloadable": "device_lock", "device_turn": "device_lock",
    "WorkerDiedError": "errors", "WorkerError": "errors",
    "WorkerGroup": "group", "GroupHandle": "handle",
    "ComponentPlacement": "placement", "NodeLayout": "placement", "PlacementError": "placement",
    "PlacementPlan": "placement", "RankPlacement": "placement", "parse_placement": "placement",
    "Worker": "worker", "WorkerContext": "worker",
}
__getattr__, __dir__ = lazy_names(__name__, _WHERE)

__all__ = sorted(_WHERE)
