"""Start several worker groups side by side, all or none."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from m2flow.runtime.cluster import Cluster
from m2flow.runtime.group import WorkerGroup

GroupSpec = tuple[type, tuple, dict, int]
"""(worker class, constructor args, constructor kwargs, torch threads per process)."""


def launch_groups(cluster: Cluster, names: Mapping[str, str], placements: Mapping[str, Any],
                  specs: Mapping[str, GroupSpec], log_dir: Path, trace_dir: Path | None = None) -> dict[str, WorkerGroup]:
    """Start one group per entry of ``specs`` in parallel (their processes import torch and build
    models at the same time); if any fails, shut the started ones down and raise its error."""
    def start(component: str) -> WorkerGroup:
        cls, args, kwargs, threads = specs[component]
        return WorkerGroup(cls, cluster, names[component], placement=placements[component], args=args,
                           kwargs=kwargs, num_threads=threads, log_dir=log_dir, trace_dir=trace_dir)

    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {c: pool.submit(start, c) for c in specs}
    groups: dict[str, WorkerGroup] = {}
    errors = []
    for c, fut in futures.items():
        try:
            groups[c] = fut.result()
        except BaseException as e:  # noqa: BLE001 - shut the others down, then report
            errors.append(e)
    if errors:
        for g in groups.values():
            g.shutdown()
        raise errors[0]
    return groups
