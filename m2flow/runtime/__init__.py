"""The M2Flow runtime: cluster, placement, workers, communication and channels. Nothing here knows RL."""

from m2flow.runtime.cluster import Cluster, ClusterConfig, NodeInfo
from m2flow.runtime.device_lock import DeviceLock, Offloadable, device_turn
from m2flow.runtime.errors import WorkerDiedError, WorkerError
from m2flow.runtime.group import WorkerGroup
from m2flow.runtime.handle import GroupHandle
from m2flow.runtime.placement import (
    ComponentPlacement,
    NodeLayout,
    PlacementError,
    PlacementPlan,
    RankPlacement,
    parse_placement,
)
from m2flow.runtime.worker import Worker, WorkerContext

__all__ = [
    "Cluster", "ClusterConfig", "ComponentPlacement", "DeviceLock", "GroupHandle", "NodeInfo",
    "NodeLayout", "Offloadable", "PlacementError", "PlacementPlan", "RankPlacement", "Worker",
    "WorkerContext", "WorkerDiedError", "WorkerError", "WorkerGroup", "device_turn", "parse_placement",
]
