"""``WorkerGroup``: launch N ranks of a worker class under a placement and call them together.

Each rank lives in its own Ray actor (``_RankHost``) that builds the user's worker inside it. The host
turns a raised exception into a ``WorkerError`` with the rank's identity and traceback, so callers never
see an opaque Ray error; a dead process surfaces as ``WorkerDiedError`` from the handle.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from m2flow.runtime.cluster import Cluster
from m2flow.runtime.auth import adopt, secret_hex
from m2flow.runtime.faults import armed, freeze_if_armed
from m2flow.runtime.handle import CallFailure, GroupHandle
from m2flow.runtime.logs import setup_logging
from m2flow.runtime.rank_core import build_worker, failure, run_method
from m2flow.runtime.placement import (
    ComponentPlacement,
    PlacementError,
    RankPlacement,
    parse_placement,
)
from m2flow.runtime.trace import ProcessInfo, configure_tracer, get_tracer
from m2flow.runtime.worker import Worker, WorkerContext, apply_thread_limits

log = logging.getLogger(__name__)


class _RankHost:
    """The Ray actor behind one rank: owns the worker object and reports failures with context."""

    def __init__(self, ctx: WorkerContext, secret: str | None = None) -> None:
        self.ctx = ctx
        self.worker: Worker | None = None
        adopt(secret)  # before any listener starts: peers must prove they hold the run's secret
        # Set in-process rather than through a Ray runtime_env, which costs a slower worker start;
        # nothing has touched CUDA or built torch's thread pool yet at this point.
        os.environ.update(WorkerGroup._process_env(ctx))
        apply_thread_limits(ctx.num_threads)
        log_file = Path(ctx.log_dir) / f"{ctx.group_name}.{ctx.rank}.log" if ctx.log_dir else None
        setup_logging(log_file=log_file, console=ctx.rank == 0,
                      prefix=f"[{ctx.group_name}:{ctx.rank}] ")
        if ctx.trace_dir:
            configure_tracer(ctx.trace_dir, ProcessInfo(
                ctx.group_name, ctx.rank, ctx.node_rank, ctx.devices, ctx.device_type))
        _keep_process_title(f"ray::{ctx.group_name}[{ctx.rank}]")

    def _failure(self, exc: BaseException) -> CallFailure:
        return failure(self.ctx, exc)

    def free_port(self) -> int:
        """A free port on this rank's own address, where rank 0 will serve torch's store."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self.ctx.node_ip, 0))
            return s.getsockname()[1]

    def construct(self, master_addr: str, master_port: int, cls: type[Worker],
                  args: tuple, kwargs: dict) -> Any:
        self.ctx = self.ctx.with_master(master_addr, master_port)
        os.environ.update(self.ctx.dist_env())
        try:
            self.worker = build_worker(cls, self.ctx, args, kwargs)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            return self._failure(e)
        # The objects made so far (imported modules, the model, the tokenizer: nearly all the process will
        # hold) leave the garbage collector's sight. A full collection would otherwise walk them all when it
        # comes due: 0.2 s in one training step of a tiny model (a 50 ms step), at the same step of every run.
        gc.freeze()
        if self.ctx.pin_cpus:
            pin_to_devices(self.ctx.devices)
        return None

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        # The fault-injection point of recovery tests (off unless the launching process armed it).
        freeze_if_armed(self.ctx.freeze_at, self.ctx.group_name, self.ctx.rank, method)
        try:
            return run_method(self.worker, method, args, kwargs)
        except BaseException as e:  # noqa: BLE001
            return self._failure(e)

    def flush_trace(self) -> int:
        return get_tracer().flush()

    def context(self) -> WorkerContext:
        return self.ctx

    def pid(self) -> int:
        return os.getpid()


def pin_to_devices(devices: Sequence[int]) -> None:
    """Pin this process to the cores of CPU device slots ``devices`` (slot d: the d-th of the cores it may use,
    modulo their number)."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[d % len(allowed)] for d in devices})


_RemoteHost = ray.remote(_RankHost)


def _keep_process_title(idle: str) -> None:
    """Title this process ``idle`` between calls, where Ray would put back ``ray::_RankHost``.

    Ray titles a worker process after each task it runs and, once the task returns, after the actor's
    class; it does both through ``ray._private.worker._changeproctitle(title, next_title)``, looked up
    at each task. Wrapping it keeps the task's own title during a call (``ray::group[rank].method``)
    and names the rank afterwards. Takes effect from the end of the next call (the host's first call,
    ``construct``, follows at once). Should Ray drop that function, titles are Ray's again: nothing
    else depends on them.
    """
    from ray._private import worker as ray_worker

    change = getattr(ray_worker, "_changeproctitle", None)
    if change is None or getattr(change, "m2flow_idle", None) is not None:
        return

    def changeproctitle(title: str, next_title: str) -> Any:
        return change(title, idle)

    changeproctitle.m2flow_idle = idle  # type: ignore[attr-defined]
    ray_worker._changeproctitle = changeproctitle


def _actor_name(group: str, rank: int) -> str:
    return f"{group}:{rank}"


def _task_name(group: str, rank: int, method: str) -> str:
    """What ``ps`` shows for a rank while it runs ``method``: ``ray::group[rank].method``."""
    return f"{group}[{rank}].{method}"


class WorkerGroup:
    """N ranks of one worker class; calling a method runs it on all (or chosen) ranks."""

    def __init__(
        self,
        worker_cls: type[Worker],
        cluster: Cluster,
        name: str,
        *,
        num_ranks: int | None = None,
        placement: ComponentPlacement | str | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        num_threads: int = 1,
        max_concurrency: int = 1,
        log_dir: str | Path | None = None,
        detached: bool = False,
        trace_dir: str | Path | None = None,
    ) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"worker_cls must be a subclass of Worker, got {worker_cls!r}")
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.name = name
        self.cluster = cluster
        self.placement = self._resolve_placement(cluster, name, num_ranks, placement)
        self._traced = trace_dir is not None
        contexts = self._contexts(cluster, num_threads, log_dir, trace_dir)
        self._hosts = []
        for ctx in contexts:
            node = cluster.nodes[ctx.node_rank]
            options: dict[str, Any] = {
                "name": _actor_name(name, ctx.rank),
                "namespace": cluster.config.namespace,
                # Placement is ours: actors reserve no Ray CPUs so collocated ranks can share cores.
                "num_cpus": 0,
                "max_concurrency": max_concurrency,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            }
            if detached:
                options["lifetime"] = "detached"
            self._hosts.append(_RemoteHost.options(**options).remote(ctx, secret_hex()))
        master_port = ray.get(self._hosts[0].free_port.remote())
        master_addr = cluster.nodes[contexts[0].node_rank].ip
        refs = [
            h.construct.options(name=_task_name(name, r, "__init__")).remote(
                master_addr, master_port, worker_cls, tuple(args), dict(kwargs or {}))
            for r, h in enumerate(self._hosts)
        ]
        try:
            GroupHandle(refs, range(len(refs)), self._describe, "__init__").wait()
        except BaseException:
            self.shutdown()
            raise
        self._contexts_by_rank = [c.with_master(master_addr, master_port) for c in contexts]
        log.info("launched %s: %d rank(s) of %s", name, len(self._hosts), worker_cls.__name__)

    # -- construction helpers ----------------------------------------------------------------
    @staticmethod
    def _resolve_placement(
        cluster: Cluster, name: str, num_ranks: int | None,
        placement: ComponentPlacement | str | None,
    ) -> ComponentPlacement:
        if isinstance(placement, ComponentPlacement):
            return placement
        if isinstance(placement, str):
            body = placement.strip()
            is_body = body[:1].isdigit() or body == "all" or body.startswith("all@")
            plan = parse_placement(f"{name}: {body}" if is_body else body, cluster.layout)
            return plan[name]
        if num_ranks is None or num_ranks < 1:
            raise PlacementError(f"group {name!r}: give num_ranks >= 1 or a placement")
        # Without a placement, rank r takes device r modulo the cluster's devices.
        table = cluster.layout.device_table(None)
        return ComponentPlacement(name, tuple(
            RankPlacement(r, table[r % len(table)][0], (table[r % len(table)][1],),
                          (r % len(table),))
            for r in range(num_ranks)
        ))

    def _contexts(self, cluster: Cluster, num_threads: int, log_dir: str | Path | None,
                  trace_dir: str | Path | None = None) -> list[WorkerContext]:
        ranks = self.placement.ranks
        per_node: dict[int, list[int]] = {}
        for r in ranks:
            per_node.setdefault(r.node_rank, []).append(r.rank)
        out = []
        for r in ranks:
            node = cluster.nodes[r.node_rank]
            out.append(
                WorkerContext(
                    group_name=self.name, rank=r.rank, world_size=len(ranks),
                    node_rank=r.node_rank, node_id=node.node_id, node_ip=node.ip,
                    devices=r.local_devices, device_type=node.device_type,
                    local_rank=per_node[r.node_rank].index(r.rank),
                    local_world_size=len(per_node[r.node_rank]),
                    namespace=cluster.config.namespace, cluster_id=cluster.cluster_id,
                    num_threads=num_threads,
                    log_dir=str(log_dir) if log_dir is not None else None,
                    trace_dir=str(trace_dir) if trace_dir is not None else None,
                    pin_cpus=cluster.config.pin_cpus and node.device_type == "cpu",
                    freeze_at=armed(),
                )
            )
        return out

    @staticmethod
    def _process_env(ctx: WorkerContext) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": str(ctx.num_threads), "MKL_NUM_THREADS": str(ctx.num_threads)}
        if ctx.device_type == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in ctx.devices)
        return env

    # -- attach ------------------------------------------------------------------------------
    @classmethod
    def attach(cls, name: str, cluster: Cluster | None = None, namespace: str | None = None
               ) -> WorkerGroup:
        """Re-attach to a running named group (from another worker, or another driver if detached)."""
        ns = namespace or (cluster.config.namespace if cluster else "m2flow")
        try:
            first = ray.get_actor(_actor_name(name, 0), namespace=ns)
        except ValueError:
            raise LookupError(f"no worker group named {name!r} in namespace {ns!r}") from None
        ctx0: WorkerContext = ray.get(first.context.remote())
        self = cls.__new__(cls)
        self.name = name
        self.cluster = cluster
        self._hosts = [first] + [
            ray.get_actor(_actor_name(name, r), namespace=ns) for r in range(1, ctx0.world_size)
        ]
        self._contexts_by_rank = ray.get([h.context.remote() for h in self._hosts])
        self.placement = None
        self._traced = bool(self._contexts_by_rank[0].trace_dir)
        return self

    # -- calling -----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self._hosts)

    @property
    def contexts(self) -> list[WorkerContext]:
        return list(self._contexts_by_rank)

    def _describe(self, rank: int) -> tuple[str, int, str]:
        ctxs = getattr(self, "_contexts_by_rank", None)
        if ctxs:
            c = ctxs[rank]
            return self.name, rank, f"{c.node_rank} ({c.node_ip})"
        return self.name, rank, "?"

    def _check_ranks(self, ranks: Sequence[int] | None) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad or len(set(ranks)) != len(ranks):
            raise ValueError(
                f"group {self.name!r} has ranks 0-{self.world_size - 1}; cannot call ranks {ranks}"
            )
        return ranks

    def execute(self, method: str, *args: Any, ranks: Sequence[int] | None = None,
                **kwargs: Any) -> GroupHandle:
        """Call ``method(*args, **kwargs)`` on all ranks (or ``ranks``); returns a handle at once."""
        chosen = self._check_ranks(ranks)
        refs = [self._call(r, method).remote(method, args, kwargs) for r in chosen]
        return GroupHandle(refs, chosen, self._describe, method)

    def execute_each(self, method: str, per_rank_args: Sequence[Sequence[Any]],
                     ranks: Sequence[int] | None = None) -> GroupHandle:
        """Call ``method`` with different positional arguments on each chosen rank (scatter)."""
        chosen = self._check_ranks(ranks)
        if len(per_rank_args) != len(chosen):
            raise ValueError(
                f"{len(per_rank_args)} argument tuples for {len(chosen)} rank(s) of {self.name!r}"
            )
        refs = [self._call(r, method).remote(method, tuple(a), {})
                for r, a in zip(chosen, per_rank_args)]
        return GroupHandle(refs, chosen, self._describe, method)

    @property
    def _task_events(self) -> bool:
        cluster = getattr(self, "cluster", None)
        return bool(cluster is not None and cluster.config.task_events)

    def _call(self, rank: int, method: str) -> Any:
        # Named per call: Ray titles the process after the task, so ``ps`` shows the group and rank.
        # Without task events Ray's GCS keeps no record of the call (it would keep up to 100,000).
        return self._hosts[rank].call.options(name=_task_name(self.name, rank, method),
                                              enable_task_events=self._task_events)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> GroupHandle:
            return self.execute(method, *args, ranks=ranks, **kwargs)

        return call

    def pids(self) -> list[int]:
        """Process id of every rank (for diagnostics)."""
        return ray.get([h.pid.remote() for h in self._hosts])

    def flush_trace(self, timeout: float = 30.0) -> None:
        """Write every rank's buffered trace events to its shard (a no-op when not traced)."""
        if not getattr(self, "_traced", False) or not self._hosts:
            return
        try:
            ray.get([h.flush_trace.remote() for h in self._hosts], timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a dead rank's events are lost, the rest are kept
            log.warning("could not flush the trace of every rank of %s: %s", self.name, e)

    def shutdown(self) -> None:
        """Kill every rank of the group (after flushing their trace events, when traced)."""
        # A short wait: a rank stuck in a call must not hold up the shutdown for long.
        self.flush_trace(timeout=5.0)
        for h in getattr(self, "_hosts", []):
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._hosts = []

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, world_size={self.world_size})"
