"""Executors apply resolved placements: Ray (a process per rank) or local (objects in this process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from m2flow.lazy import lazy_names
from m2flow.runtime.cluster import Cluster, ClusterConfig
from m2flow.runtime.executors.base import Executor, GroupSpec, Handle, WorkerGroup
from m2flow.runtime.placement import executor_kind

if TYPE_CHECKING:
    from m2flow.runtime.executors.local import LocalExecutor, LocalGroup
    from m2flow.runtime.executors.ray import RayExecutor, launch_groups

# The executors resolve on first use: what only declares or plans a workflow (``m2flow plan``) imports
# this package for its types and must not pay for Ray.
_HOME = {"LocalExecutor": "local", "LocalGroup": "local", "RayExecutor": "ray", "launch_groups": "ray"}
__getattr__, __dir__ = lazy_names(__name__, _HOME)

__all__ = ["Executor", "GroupSpec", "Handle", "WorkerGroup", "LocalExecutor", "LocalGroup", "RayExecutor", "launch_groups", "make_executor"]


def make_executor(placement: str, config: ClusterConfig | None = None, cluster: Cluster | None = None) -> Executor:
    """The executor a placement string (or a Plan's executor kind, ``local`` / ``ray``) asks for: ``"local"``
    runs every component, one rank each, on device 0 in this process (no Ray); anything else runs on Ray
    (``cluster``, or one started)."""
    if executor_kind(placement) == "local":
        from m2flow.runtime.executors.local import LocalExecutor

        return LocalExecutor(config)
    from m2flow.runtime.executors.ray import RayExecutor

    return RayExecutor(config, cluster)
