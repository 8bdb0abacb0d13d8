"""``WorkerGroup``: launch N ranks of a worker class under a placement and call them together.

Each rank lives in its own Ray actor (``RankHost``, ``rank_host.py``) that builds the user's worker inside it. The host
turns a raised exception into a ``WorkerError`` with the rank's identity and traceback, so callers never
see an opaque Ray error; a dead process surfaces as ``WorkerDiedError`` from the handle.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from m2flow.runtime import host_pool
from m2flow.runtime.cluster import Cluster
from m2flow.runtime.auth import secret_hex
from m2flow.runtime.faults import armed
from m2flow.runtime.handle import GroupHandle
from m2flow.runtime.rank_host import RankHost
from m2flow.runtime.placement import (
    ComponentPlacement,
    PlacementError,
    RankPlacement,
    parse_placement,
)
from m2flow.runtime.worker import Worker, WorkerContext

log = logging.getLogger(__name__)


_RemoteHost = ray.remote(RankHost)


def _actor_name(group: str, rank: int) -> str:
    """A new rank process's Ray name: unique, since a reused process keeps it while serving other groups."""
    return f"{group}:{rank}:{uuid.uuid4().hex[:8]}"


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
        self._detached = detached
        self._keep = 0 if detached else cluster.config.idle_hosts
        self._pool_keys = [(cluster.nodes[c.node_rank].node_id, cluster.config.namespace, max_concurrency)
                           for c in contexts]
        self._namespace = cluster.config.namespace
        self._serving = uuid.uuid4().hex  # what this group's calls carry (``RankHost.serving``)
        self._hosts, self._names = self._start_hosts(contexts, max_concurrency)
        host_pool.register(self._namespace, name, self._names)
        master_port = ray.get(self._hosts[0].free_port.remote())
        master_addr = cluster.nodes[contexts[0].node_rank].ip
        refs = [
            h.construct.options(name=_task_name(name, r, "__init__")).remote(
                self._serving, master_addr, master_port, worker_cls, tuple(args), dict(kwargs or {}))
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

    def _start_hosts(self, contexts: list[WorkerContext], max_concurrency: int) -> tuple[list[Any], list[str]]:
        """One host per rank: a released one of the same node and shape where the pool has it, else a new
        process. A pooled host that fails its reset (it died while waiting) is replaced by a new one.
        Returns the hosts and their Ray names."""
        secret = secret_hex()
        hosts: list[tuple[Any, str] | None] = []
        resets: dict[int, Any] = {}
        for ctx, key in zip(contexts, self._pool_keys):
            pooled = host_pool.take(*key) if self._keep else None
            if pooled is not None:
                resets[len(hosts)] = pooled[0].reset.remote(ctx, secret, self._serving)
            hosts.append(pooled)
        for i, ref in resets.items():
            try:
                ray.get(ref, timeout=60)
            except Exception:  # noqa: BLE001 - gone while pooled: start a new one
                log.debug("a pooled rank process could not be reused", exc_info=True)
                hosts[i] = None
        for i, ctx in enumerate(contexts):
            if hosts[i] is None:
                name = _actor_name(self.name, ctx.rank)
                hosts[i] = (self._new_host(ctx, name, max_concurrency, secret), name)
        return [h for h, _ in hosts], [n for _, n in hosts]

    def _new_host(self, ctx: WorkerContext, name: str, max_concurrency: int, secret: str) -> Any:
        node = self.cluster.nodes[ctx.node_rank]
        options: dict[str, Any] = {
            "name": name,
            "namespace": self.cluster.config.namespace,
            # Placement is ours: actors reserve no Ray CPUs so collocated ranks can share cores.
            "num_cpus": 0,
            "max_concurrency": max_concurrency,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        }
        if self._detached:
            options["lifetime"] = "detached"
        return _RemoteHost.options(**options).remote(ctx, secret, self._serving)

    # -- attach ------------------------------------------------------------------------------
    @classmethod
    def attach(cls, name: str, cluster: Cluster | None = None, namespace: str | None = None
               ) -> WorkerGroup:
        """Re-attach to a running named group (from another worker, or another driver if detached)."""
        ns = namespace or (cluster.config.namespace if cluster else "m2flow")
        names = host_pool.lookup(ns, name) if ray.is_initialized() else None
        if not names:
            raise LookupError(f"no worker group named {name!r} in namespace {ns!r}")
        self = cls.__new__(cls)
        self.name = name
        self.cluster = cluster
        try:
            self._hosts = [ray.get_actor(n, namespace=ns) for n in names]
            self._names = list(names)
        except ValueError:
            raise LookupError(f"worker group {name!r} in namespace {ns!r} has lost a rank process") from None
        self._namespace = ns
        self._keep = 0  # attached: the group's launcher owns its processes
        self._pool_keys = []
        self._contexts_by_rank = ray.get([h.context.remote() for h in self._hosts])
        self._serving = ray.get(self._hosts[0].serving_token.remote())
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
        refs = [self._call(r, method).remote(self._serving, method, args, kwargs) for r in chosen]
        return GroupHandle(refs, chosen, self._describe, method)

    def execute_each(self, method: str, per_rank_args: Sequence[Sequence[Any]],
                     ranks: Sequence[int] | None = None) -> GroupHandle:
        """Call ``method`` with different positional arguments on each chosen rank (scatter)."""
        chosen = self._check_ranks(ranks)
        if len(per_rank_args) != len(chosen):
            raise ValueError(
                f"{len(per_rank_args)} argument tuples for {len(chosen)} rank(s) of {self.name!r}"
            )
        refs = [self._call(r, method).remote(self._serving, method, tuple(a), {})
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
        """Stop every rank of the group (after flushing their trace events, when traced). Each process is
        taken apart and kept for a later group when it shows itself clean (``host_pool.py``), else killed;
        detached groups and attached views kill theirs."""
        hosts = getattr(self, "_hosts", [])
        if not hosts:
            return
        # A short wait: a rank stuck in a call must not hold up the shutdown for long.
        self.flush_trace(timeout=5.0)
        self._hosts = []
        host_pool.unregister(self._namespace, self.name)
        host_pool.release_later(list(zip(hosts, self._names)), self._pool_keys or [("", "", 0)] * len(hosts),
                                self._keep)

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, world_size={self.world_size})"
