"""What ``m2flow profile`` and ``placement: auto`` need of a workflow, derived from its declaration.

Nothing here is declared by hand: the timing metric and threads key of every component and the
fusion keys come from the workflow's graph; probes, lengths, byte counts and resumability from the
``Workflow`` object's hooks; ``train`` is the driver's run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from m2flow.driver.run_config import RUN_KEYS


def profile_hash(cfg: Any, workflow: Any) -> str:
    """The hash a profile of ``cfg`` carries: the config without the workflow's execution keys (placement,
    cluster, fusion, threads and tunable keys: what the search varies or a plan decides), ``plan_file``
    and ``RUN_KEYS``."""
    from m2flow.planner.profile import config_hash

    ignore = ("placement", "cluster", "plan_file", *workflow.execution_keys(), *RUN_KEYS)
    return config_hash(asdict(cfg), ignore=tuple(dict.fromkeys(ignore)))


@dataclass(frozen=True)
class AutoSupport:
    """A workflow as the profiler and re-planning see it."""

    timings: Mapping[str, str]
    """component -> the iteration metric holding its busy seconds (the slowest rank's)"""
    probes: Callable[[Any], list[dict[str, Any]]]
    """``probes(cfg)``: the config overrides of each batch size to profile (one run each)"""
    length: Callable[[Any, int], dict[str, Any]]
    """``length(cfg, iterations)``: the overrides that make a run that many iterations long"""
    profile_fusions: Mapping[str, bool]
    """fusion keys set while profiling, so that each process runs one component at a time"""
    train: Callable[..., Any]
    """``train(cfg, cluster, watch)``: a run whose result has ``history`` (metrics per iteration)"""
    iterations: Callable[[Any, Any], int]
    """``iterations(cfg, plan)``: iterations of the whole run"""
    edge_bytes: Callable[[Any], dict[str, float]]
    """``edge_bytes(cfg)``: bytes per item of each data edge"""
    model_bytes: Callable[[Any], tuple[float, float]]
    """``model_bytes(checkpoint)``: (policy weights, trained state) in bytes, from a profiling run's checkpoint"""
    resumable: Callable[[Any, Any], bool]
    """``resumable(old_plan, new_plan)``: a checkpoint of the old plan can be resumed under the new"""
    thread_keys: Mapping[str, str]
    """component -> the config key of its torch threads"""
    cpu_timings: Mapping[str, str] = field(default_factory=dict)
    """component -> the iteration metric holding the CPU part of its busy seconds (per rank); a component
    without one computes all its busy time"""


def auto_support(workflow: Any) -> AutoSupport:
    """The profiler's view of ``workflow`` (a registered ``Workflow``)."""
    from m2flow.driver.run import train

    return AutoSupport(
        timings=workflow.graph.timings(), probes=workflow.profile_probes, length=workflow.profile_length,
        profile_fusions={key: True for key in workflow.graph.fusion_keys().values()},
        train=lambda cfg, cluster=None, watch=None: train(workflow, cfg, cluster, watch),
        iterations=workflow.iterations, edge_bytes=workflow.edge_bytes, model_bytes=workflow.model_bytes,
        resumable=workflow.resumable, thread_keys=workflow.graph.thread_keys(),
        cpu_timings=workflow.graph.cpu_timings())
