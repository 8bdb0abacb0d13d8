"""Executors apply resolved placements: Ray (a process per rank) or local (objects in this process)."""

from m2flow.runtime.executors.base import Executor, GroupSpec
from m2flow.runtime.executors.ray import RayExecutor, launch_groups

__all__ = ["Executor", "GroupSpec", "RayExecutor", "launch_groups"]
