"""Start or attach to Ray, and describe the nodes and devices placement works with.

On machines with CUDA GPUs the devices are the GPUs. On CPU-only nodes each node offers a configurable
number of CPU "device slots", so the same placement strings work identically everywhere.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


from m2flow.runtime.auth import run_secret
from m2flow.runtime.device_lock import remove_lock_dir
from m2flow.runtime import host_pool, ray_watchdog
from m2flow.runtime.placement import SYNTAX_LAYOUT_DEVICES, NodeLayout, PlacementError, PlacementPlan, parse_placement

log = logging.getLogger(__name__)


@dataclass
class ClusterConfig:
    """Where the workers run."""

    address: str | None = field(
        default=None,
        metadata={"doc": "Ray address to attach to (e.g. 'auto' or 'ip:6379'); None starts a local Ray"},
    )
    namespace: str = field(default="m2flow", metadata={"doc": "Ray namespace for named worker groups"})
    cpu_devices_per_node: int = field(
        default=8, metadata={"doc": "device slots per node when a node has no CUDA GPU"}
    )
    num_cpus: int | None = field(
        default=None, metadata={"doc": "CPUs a locally started Ray may use (None: all of them)"}
    )
    pin_cpus: bool = field(
        default=False,
        metadata={"doc": "on nodes without GPUs, pin each rank's process to the cores of its device slots (slot d: "
                         "the d-th core it may use, modulo their number), so that components placed on different "
                         "devices never share a core; off: the OS moves processes between cores"},
    )
    include_dashboard: bool = field(
        default=False, metadata={"doc": "start Ray's dashboard with a locally started Ray"}
    )
    task_events: bool = field(
        default=False,
        metadata={"doc": "record every worker call in Ray's task table (Ray's dashboard, `ray list tasks`); off: "
                         "Ray's control store would keep a record of each call for the whole run"},
    )
    idle_hosts: int = field(
        default=4,
        metadata={"doc": "rank processes kept per node (and per concurrency) after their group shuts down cleanly, "
                         "for a later group of the same driver to reuse instead of starting (and importing torch "
                         "in) a new process; 0: never"},
    )
    node_groups: dict[str, list[int]] = field(
        default_factory=dict,
        metadata={"doc": "named sets of node ranks, used as 'component: 0-3@group' in placements"},
    )

    def validate(self) -> None:
        if self.cpu_devices_per_node < 1:
            raise ValueError(f"cpu_devices_per_node must be >= 1, got {self.cpu_devices_per_node}")
        if self.idle_hosts < 0:
            raise ValueError(f"idle_hosts must be >= 0, got {self.idle_hosts}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"num_cpus must be >= 1 or None, got {self.num_cpus}")
        for name, nodes in self.node_groups.items():
            if not nodes:
                raise ValueError(f"node_groups: group {name!r} is empty")
            if len(set(nodes)) != len(nodes) or min(nodes) < 0:
                raise ValueError(f"node_groups: group {name!r} must list distinct node ranks >= 0, got {nodes}")


def expected_layout(config: ClusterConfig) -> NodeLayout | None:
    """The device layout a locally started cluster will have, known before Ray starts.

    None when attaching to an existing cluster: its nodes are only known once connected.
    """
    if config.address:
        return None
    gpus = 0
    if _gpu_driver_present():  # else torch would count none: configs validate without importing it
        try:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            pass
    groups = {k: tuple(v) for k, v in config.node_groups.items()}
    return NodeLayout((gpus or config.cpu_devices_per_node,), groups)


def _gpu_driver_present() -> bool:
    """Whether torch could see a GPU here: a CUDA (``/dev/nvidia<N>``, WSL's ``/dev/dxg``) or ROCm
    (``/dev/kfd``) device node, and ``CUDA_VISIBLE_DEVICES`` not set empty (which hides every device)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or any(os.path.exists(p) for p in ("/dev/dxg", "/dev/kfd"))


_STARTUP_ATTEMPTS = 3


def _start_local_ray(kwargs: dict) -> None:
    """``ray.init`` for a local Ray, retried when its processes miss Ray's fixed start-up deadline.

    Ray waits a hard-coded 30 s for its own processes; on a busy machine they can miss it, and a
    second attempt usually succeeds. Other failures are raised at once.
    """
    import ray  # on use: planning commands read cluster layouts without Ray

    for attempt in range(1, _STARTUP_ATTEMPTS + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(e) or attempt == _STARTUP_ATTEMPTS:
                raise
            log.warning("local Ray missed its start-up deadline (attempt %d of %d); retrying",
                        attempt, _STARTUP_ATTEMPTS)
            ray.shutdown()


def _start_watched() -> Any:
    """Before a local Ray starts: stop what killed runs left behind (saying so), mark the processes Ray
    is about to start, and start the watchdog that stops them if this driver dies (``ray_watchdog``)."""
    if not sys.platform.startswith("linux"):
        return None
    for driver, count in ray_watchdog.sweep_orphans().items():
        log.warning("stopped %d process(es) left by the local Ray of an earlier run whose driver (pid %d) "
                    "was killed", count, driver)
    marker = ray_watchdog.new_marker()
    os.environ[ray_watchdog.ENV_VAR] = marker  # inherited by every process of the Ray started next
    return ray_watchdog.start_watchdog(marker)


def check_placement(
    spec: str | Mapping[str, str], config: ClusterConfig, components: Sequence[str]
) -> None:
    """Fail early (before Ray starts) when a placement cannot fit the cluster it will run on."""
    layout = expected_layout(config)
    if layout is None:
        parse_placement(spec, NodeLayout((SYNTAX_LAYOUT_DEVICES,)), components)  # syntax and names only
    else:
        parse_placement(spec, layout, components)


@dataclass(frozen=True)
class NodeInfo:
    """One node of the cluster, as placement sees it."""

    node_rank: int
    node_id: str
    ip: str
    num_cpus: int
    num_gpus: int
    device_type: str  # "cuda" or "cpu"
    num_devices: int


def _prefer_loopback() -> None:
    """Make a locally started Ray bind its node to 127.0.0.1.

    On Linux Ray replaces a loopback ``_node_ip_address`` with the machine's routable address unless
    its cluster mode is off; a single-machine engine should not listen on the network.
    """
    try:
        from ray._private import ray_constants
    except ImportError:  # layout changed: fall back to Ray's default address
        log.warning("cannot bind the local Ray to 127.0.0.1 with this Ray version")
        return
    ray_constants.ENABLE_RAY_CLUSTER = False


def _local_init_kwargs(cfg: ClusterConfig) -> dict[str, Any]:
    # Bound to loopback and without the dashboard: a local Ray is a private engine, not a service.
    kwargs: dict[str, Any] = {
        "address": "local",
        "_node_ip_address": "127.0.0.1",
        "include_dashboard": cfg.include_dashboard,
        "namespace": cfg.namespace,
        "log_to_driver": True,
        "configure_logging": False,
        # Ray starts its workers at niceness 15 by default, behind every other process of the
        # user: the workers are the job here, so they run at the driver's priority.
        "_system_config": {"worker_niceness": 0},
    }
    if cfg.num_cpus is not None:
        kwargs["num_cpus"] = cfg.num_cpus
    return kwargs


class Cluster:
    """A handle on the Ray cluster: start or attach, list nodes and devices, resolve placements."""

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config or ClusterConfig()
        self.config.validate()
        # Ray's token auth writes a file under ~/.ray unless disabled; a local engine needs no auth.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        self._started_ray = False
        self._watchdog = None
        # The run's secret exists before Ray starts, so a local raylet hands it to every worker.
        run_secret()
        import ray

        if not ray.is_initialized():
            if self.config.address:
                log.info("attaching to Ray at %s", self.config.address)
                ray.init(address=self.config.address, namespace=self.config.namespace,
                         log_to_driver=True, configure_logging=False)
            else:
                log.info("starting a local Ray (dashboard %s)",
                         "on" if self.config.include_dashboard else "off")
                _prefer_loopback()
                self._watchdog = _start_watched()
                try:
                    _start_local_ray(_local_init_kwargs(self.config))
                except BaseException:
                    ray_watchdog.stop_watchdog(self._watchdog)
                    raise
                self._started_ray = True
        self.cluster_id = uuid.uuid4().hex[:12]
        # A driver that exits without shutdown() still leaves no lock directory behind, and its pooled rank
        # processes are gone before Ray's own exit hook (registered earlier, so it runs later) stops Ray.
        atexit.register(self.shutdown)
        self.nodes = self._discover_nodes()
        for name, ranks in self.config.node_groups.items():
            bad = [r for r in ranks if r >= len(self.nodes)]
            if bad:
                raise PlacementError(
                    f"node group {name!r} names node(s) {bad}, but the cluster has {len(self.nodes)} node(s)"
                )

    def _discover_nodes(self) -> list[NodeInfo]:
        import ray

        alive = [n for n in ray.nodes() if n.get("Alive")]
        head_ip = ray.util.get_node_ip_address()
        # Stable node ranks: the node this driver runs on first, then by IP and id.
        alive.sort(key=lambda n: (n["NodeManagerAddress"] != head_ip, n["NodeManagerAddress"], n["NodeID"]))
        nodes = []
        for rank, n in enumerate(alive):
            res = n.get("Resources", {})
            gpus = int(res.get("GPU", 0))
            nodes.append(
                NodeInfo(
                    node_rank=rank,
                    node_id=n["NodeID"],
                    ip=n["NodeManagerAddress"],
                    num_cpus=int(res.get("CPU", 0)),
                    num_gpus=gpus,
                    device_type="cuda" if gpus else "cpu",
                    num_devices=gpus if gpus else self.config.cpu_devices_per_node,
                )
            )
        return nodes

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_devices(self) -> int:
        return sum(n.num_devices for n in self.nodes)

    @property
    def layout(self) -> NodeLayout:
        groups = {k: tuple(v) for k, v in self.config.node_groups.items()}
        return NodeLayout(tuple(n.num_devices for n in self.nodes), groups)

    def placement(
        self, spec: str | Mapping[str, str], components: Sequence[str] | None = None
    ) -> PlacementPlan:
        """Resolve a placement string against this cluster's nodes and devices."""
        return parse_placement(spec, self.layout, components)

    def shutdown(self) -> None:
        """Stop Ray if this handle started it; remove this node's device-lock directory of the run."""
        import ray

        if self._started_ray and ray.is_initialized():
            ray_watchdog.stop_watchdog(self._watchdog)
            host_pool.clear()
            ray.shutdown()
            self._started_ray = False
        remove_lock_dir(self.cluster_id)

    def __repr__(self) -> str:
        kinds = ", ".join(f"node{n.node_rank}:{n.num_devices}x{n.device_type}" for n in self.nodes)
        return f"Cluster({kinds})"
