"""The ``Worker`` base class: what every component process knows about itself and can do.

A subclass is an ordinary class. ``WorkerGroup`` launches one Ray actor per rank (the local executor:
one thread of the driver process per rank), fills in the ``WorkerContext`` *before* the subclass's
``__init__`` runs (so ``__init__`` may use ``self.rank``), and calls its methods. Workers that hold
device state override ``offload``/``onload``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from m2flow.runtime.dist_store import tcp_store
from m2flow.runtime.device_lock import DeviceLock, device_turn
from m2flow.runtime.hosting import Hostable
from m2flow.runtime.trace import Tracer, get_tracer


@dataclass(frozen=True)
class WorkerContext:
    """Identity and surroundings of one rank, fixed at launch."""

    group_name: str
    rank: int
    world_size: int
    node_rank: int
    node_id: str
    node_ip: str
    devices: tuple[int, ...]  # device indices local to the node
    device_type: str  # "cuda" or "cpu"
    local_rank: int  # rank among this group's ranks on the same node
    local_world_size: int
    namespace: str
    cluster_id: str
    num_threads: int
    log_dir: str | None = None
    trace_dir: str | None = None  # where this rank writes its trace shard; None: not traced
    master_addr: str = ""
    master_port: int = 0
    in_process: bool = False  # True: a thread of the driver process hosts this rank (local executor)
    pin_cpus: bool = False  # pin the rank's process to the cores of its device slots (``cluster.pin_cpus``)
    freeze_at: str | None = None  # fault injection for recovery tests (``runtime/faults.py``); None: off

    def with_master(self, addr: str, port: int) -> WorkerContext:
        return replace(self, master_addr=addr, master_port=port)

    def dist_env(self) -> dict[str, str]:
        """The ``torch.distributed`` env:// variables for this rank."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


class Worker:
    """Base class of every component. Subclasses need not call ``super().__init__()``."""

    _m2flow_ctx: WorkerContext

    # -- identity --------------------------------------------------------------------------
    @property
    def context(self) -> WorkerContext:
        ctx = getattr(self, "_m2flow_ctx", None)
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__name__} was not launched by a WorkerGroup; it has no rank or devices"
            )
        return ctx

    @property
    def rank(self) -> int:
        return self.context.rank

    @property
    def world_size(self) -> int:
        return self.context.world_size

    @property
    def group_name(self) -> str:
        return self.context.group_name

    @property
    def node_rank(self) -> int:
        return self.context.node_rank

    @property
    def node_ip(self) -> str:
        return self.context.node_ip

    @property
    def devices(self) -> tuple[int, ...]:
        return self.context.devices

    @property
    def cluster_namespace(self) -> str:
        return self.context.namespace

    @property
    def torch_device(self) -> Any:
        """``cuda:0`` on a GPU rank (its devices are the visible ones), else ``cpu``."""
        import torch

        return torch.device("cuda:0" if self.context.device_type == "cuda" else "cpu")

    @property
    def tracer(self) -> Tracer:
        """This process's tracer: ``with self.tracer.span("train", cat="train", mb=i):``."""
        return get_tracer()

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(f"m2flow.worker.{self.group_name}.{self.rank}")

    # -- hosted components (fusions) ---------------------------------------------------------
    def host_components(self, hosted: Mapping[str, Hostable] | None) -> None:
        """Run each of ``hosted`` (component name -> its settings) inside this worker's processes; each part
        is built by its settings' ``hosted_in(self)``, one that needs another part (``self.hosted(name)``)
        after it."""
        self._m2flow_hostable = dict(hosted or {})
        self._m2flow_hosted: dict[str, Any] = {}
        for name in self._m2flow_hostable:
            self.hosted(name)

    def hosted(self, name: str) -> Any:
        """The in-process part of hosted component ``name``, or None when it is not hosted here."""
        built = getattr(self, "_m2flow_hosted", None)
        if built is None:
            return None
        if name not in built:
            settings = self._m2flow_hostable.get(name)
            if settings is None:
                return None
            built[name] = settings.hosted_in(self)
        return built[name]

    def hosted_parts(self) -> list[Any]:
        """Every hosted component's in-process part."""
        return list(getattr(self, "_m2flow_hosted", {}).values())

    # -- collective set-up ------------------------------------------------------------------
    def init_process_group(self, backend: str | None = None, timeout_s: float = 300.0) -> None:
        """Initialise ``torch.distributed`` over this group's ranks (gloo on CPU, NCCL on GPU).

        Rank 0 serves the store on its node's own address (``MASTER_ADDR``), not on every
        interface as torch's ``env://`` store would: it binds the socket itself and hands it over.
        """
        import torch.distributed as dist

        if self.context.in_process:
            raise RuntimeError(
                f"{self.group_name}[{self.rank}]: torch.distributed needs a process per rank, and the local "
                "executor hosts every rank in the driver process; use a Ray placement for this component")
        if dist.is_initialized():
            return
        backend = backend or ("nccl" if self.context.device_type == "cuda" else "gloo")
        if backend == "gloo" and _is_loopback(self.context.master_addr):
            # A one-machine run keeps gloo's pair sockets on loopback too.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            backend=backend,
            store=tcp_store(self.context.master_addr, self.context.master_port, self.world_size,
                            serve=self.rank == 0, timeout_s=timeout_s),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )

    # -- context switching ------------------------------------------------------------------
    def offload(self) -> None:
        """Move this worker's device state to host memory; stateless workers need nothing."""

    def onload(self) -> None:
        """Bring the state moved by ``offload`` back onto the device."""

    @property
    def device_lock(self) -> DeviceLock:
        lock = getattr(self, "_m2flow_device_lock", None)
        if lock is None:
            owner = f"{self.group_name}[{self.rank}]"
            lock = DeviceLock(self.context.cluster_id, self._lock_keys(), owner=owner)
            self._m2flow_device_lock = lock
        return lock

    def _lock_keys(self) -> tuple[int, ...]:
        # Lock files are per node; namespacing by node rank keeps several simulated nodes on one
        # machine (ray.cluster_utils.Cluster) from sharing locks.
        return tuple(self.node_rank * 100_000 + d for d in self.devices)

    @contextmanager
    def device_turn(self, offload_after: bool = False, timeout: float | None = None) -> Iterator[None]:
        """Hold this rank's devices for a block: lock, ``onload``, run, optionally ``offload``."""
        with device_turn(self.device_lock, self, offload_after=offload_after, timeout=timeout):
            yield

    # -- point-to-point communication (delegated to the comm layer) ---------------------------
    @property
    def comm(self) -> Any:
        comm = getattr(self, "_m2flow_comm", None)
        if comm is None:
            from m2flow.runtime.comm import Communicator

            comm = Communicator(self.group_name, self.rank, self.node_ip, self.cluster_namespace,
                                world_size=self.world_size)
            self._m2flow_comm = comm
        return comm

    def send(self, obj: Any, dst_group: str, dst_rank: int, async_op: bool = False) -> Any:
        """Send ``obj`` to one rank of a group; the transport is chosen from where both live."""
        return self.comm.send(obj, dst_group, dst_rank, async_op=async_op)

    def recv(self, src_group: str, src_rank: int, async_op: bool = False) -> Any:
        """Receive the next object sent to this rank by ``src_group[src_rank]``."""
        return self.comm.recv(src_group, src_rank, async_op=async_op)

    def broadcast(self, obj: Any, dst_group: str, dst_ranks: Any = None, **kwargs: Any) -> Any:
        """Send ``obj`` to several ranks of a group."""
        return self.comm.broadcast(obj, dst_group, dst_ranks, **kwargs)


def _is_loopback(addr: str) -> bool:
    return addr in ("localhost", "::1") or addr.startswith("127.")


def apply_thread_limits(num_threads: int) -> None:
    """Give this process its share of the cores; torch's default oversubscribes shared cores."""
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    os.environ["MKL_NUM_THREADS"] = str(num_threads)
    try:
        import torch
    except ImportError:  # a worker that does not use torch
        return
    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(max(1, num_threads))
    except RuntimeError:  # already set once in this process
        pass
