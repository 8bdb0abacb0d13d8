"""The Ray executor: one Ray actor process per rank, pinned to its node, started side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from m2flow.runtime.cluster import Cluster, ClusterConfig
from m2flow.runtime.executors.base import GroupSpec
from m2flow.runtime.group import WorkerGroup
from m2flow.runtime.placement import NodeLayout, PlacementPlan


def launch_groups(cluster: Cluster, names: Mapping[str, str], placements: Mapping[str, Any],
                  specs: Mapping[str, GroupSpec], log_dir: Path, trace_dir: Path | None = None) -> dict[str, WorkerGroup]:
    """Start one group per entry of ``specs`` in parallel (their processes import torch and build
    models at the same time); if any fails, shut the started ones down and raise its error."""
    def start(component: str) -> WorkerGroup:
        spec = specs[component]
        return WorkerGroup(spec.cls, cluster, names[component], placement=placements[component], args=spec.args,
                           kwargs=spec.kwargs, num_threads=spec.threads, log_dir=log_dir, trace_dir=trace_dir)

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


class RayExecutor:
    """Applies placements on a Ray cluster: the one given, or a local Ray started (and stopped) here."""

    kind = "ray"

    def __init__(self, config: ClusterConfig | None = None, cluster: Cluster | None = None) -> None:
        self._own = cluster is None
        self.cluster = cluster if cluster is not None else Cluster(config)

    @property
    def layout(self) -> NodeLayout:
        return self.cluster.layout

    def placement(self, spec: str | Mapping[str, str], components: Sequence[str] | None = None) -> PlacementPlan:
        return self.cluster.placement(spec, components)

    def launch(self, names: Mapping[str, str], placements: PlacementPlan | Mapping[str, Any],
               specs: Mapping[str, GroupSpec], log_dir: Path, trace_dir: Path | None = None) -> dict[str, WorkerGroup]:
        return launch_groups(self.cluster, names, placements, specs, log_dir, trace_dir)

    def shutdown(self) -> None:
        if self._own:
            self.cluster.shutdown()
