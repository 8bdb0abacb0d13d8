"""Executors apply resolved placements: Ray (a process per rank) or local (objects in this process)."""

from __future__ import annotations

from m2flow.runtime.cluster import Cluster, ClusterConfig
from m2flow.runtime.executors.base import Executor, GroupSpec, Handle, WorkerGroup
from m2flow.runtime.executors.local import LocalExecutor, LocalGroup
from m2flow.runtime.executors.ray import RayExecutor, launch_groups
from m2flow.runtime.placement import executor_kind

__all__ = ["Executor", "GroupSpec", "Handle", "WorkerGroup", "LocalExecutor", "LocalGroup", "RayExecutor", "launch_groups", "make_executor"]


def make_executor(placement: str, config: ClusterConfig | None = None, cluster: Cluster | None = None) -> Executor:
    """The executor a placement string (or a Plan's executor kind, ``local`` / ``ray``) asks for: ``"local"``
    runs every component, one rank each, on device 0 in this process (no Ray); anything else runs on Ray
    (``cluster``, or one started)."""
    if executor_kind(placement) == "local":
        return LocalExecutor(config)
    return RayExecutor(config, cluster)
