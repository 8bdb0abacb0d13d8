"""The local executor: the same worker classes as objects in the driver process, no Ray at all.

Every rank is a worker object served by a thread of its own (``threads.RankThread``), so it behaves
like a Ray actor: its calls run one at a time in submission order, other ranks' calls run meanwhile.
While the executor is open, channels get in-process hosts and the rendezvous is this process's
memory (``runtime.inprocess``), so comm between two ranks hands over the object itself.

What is per process, and the rule here:
- torch's intra-op thread count: one for all ranks, set at each launch to the largest
  ``GroupSpec.threads`` of its groups, and restored at shutdown; ``OMP_NUM_THREADS`` is left as it is.
- logging handlers: each rank gets its log file (``<group>.<rank>.log`` under the log directory)
  holding the records logged on its own thread; the console is the driver's.
- the tracer: each rank's thread has a tracer of its own (``trace.set_thread_tracer``) writing the
  rank's shard, so the merged trace and the report show one row per rank as with Ray; other threads
  (the driver's, comm and channel threads) use the process's tracer.
- torch.distributed: not available (it needs a process per rank); ``Worker.init_process_group``
  fails naming the rank, so a placement that needs it fails at launch.
- CUDA: the ranks see the GPUs the driver sees; ``cuda:0`` is every rank's device, so a placement
  on any other GPU is refused at launch.
- constructor arguments: copied per rank (a cloudpickle round trip, as Ray does); method arguments and
  results are handed over as they are, so a caller must not change them while a call runs.
- the global RNGs: construction runs one rank at a time, in launch order, so seeded initialisation
  through torch's global generator is reproducible; later draws belong in a worker's own generator
  or under ``m2flow.models.rng.seeded``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from m2flow.runtime import inprocess
from m2flow.runtime.cluster import ClusterConfig, expected_layout
from m2flow.runtime.executors.base import GroupSpec
from m2flow.runtime.executors.threads import LocalHandle, RankThread
from m2flow.runtime.handle import CallFailure
from m2flow.runtime.rank_core import build_worker, failure, run_method
from m2flow.runtime.placement import ComponentPlacement, NodeLayout, PlacementError, PlacementPlan, parse_placement
from m2flow.runtime.trace import ProcessInfo, Tracer, set_thread_tracer
from m2flow.runtime.worker import Worker, WorkerContext

log = logging.getLogger(__name__)

NODE_ID = "local"
NODE_IP = "127.0.0.1"
_STOP_TIMEOUT_S = 5.0


class _ThreadFilter(logging.Filter):
    """Passes the records logged on one thread."""

    def __init__(self, ident: int) -> None:
        super().__init__()
        self.ident = ident

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self.ident


class _LocalRank:
    """One in-process rank: its context, its worker object, its thread and its log file."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.worker: Worker | None = None
        self.thread = RankThread(f"m2flow-{ctx.group_name}:{ctx.rank}")
        self._handler: logging.Handler | None = None
        self.tracer: Tracer | None = None
        if ctx.log_dir:
            path = Path(ctx.log_dir) / f"{ctx.group_name}.{ctx.rank}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(path)
            handler.setFormatter(logging.Formatter(
                f"[{ctx.group_name}:{ctx.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
            handler.addFilter(_ThreadFilter(self.thread.ident))
            logging.getLogger("m2flow").addHandler(handler)
            self._handler = handler

    def _failure(self, exc: BaseException) -> CallFailure:
        return failure(self.ctx, exc)

    def construct(self, cls: type[Worker], args: tuple, kwargs: dict) -> CallFailure | None:
        """Build the worker on this rank's thread, its context set before the subclass ``__init__``."""
        c = self.ctx
        if c.trace_dir:
            self.tracer = Tracer(c.trace_dir, ProcessInfo(c.group_name, c.rank, c.node_rank, c.devices, c.device_type))
            set_thread_tracer(self.tracer)
        try:
            self.worker = build_worker(cls, self.ctx, args, kwargs)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            return self._failure(e)
        return None

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        try:
            return run_method(self.worker, method, args, kwargs)
        except BaseException as e:  # noqa: BLE001
            return self._failure(e)

    def close(self) -> None:
        """Stop the thread (after its queued calls, for a short while), close comm and the log file."""
        if not self.thread.stop(_STOP_TIMEOUT_S):
            log.warning("%s still busy after %.0fs at shutdown; left running as a daemon thread",
                        self.thread.name, _STOP_TIMEOUT_S)
        comm = getattr(self.worker, "_m2flow_comm", None)
        if comm is not None:
            comm.close()
        if self.tracer is not None:
            self.tracer.close()
        if self._handler is not None:
            logging.getLogger("m2flow").removeHandler(self._handler)
            self._handler.close()
            self._handler = None


class LocalGroup:
    """N in-process ranks of one worker class; the calls ``WorkerGroup`` offers, on threads."""

    def __init__(self, worker_cls: type[Worker], name: str, placement: ComponentPlacement,
                 contexts: Sequence[WorkerContext], args: Sequence[Any] = (),
                 kwargs: Mapping[str, Any] | None = None) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"worker_cls must be a subclass of Worker, got {worker_cls!r}")
        self.name = name
        self.placement = placement
        self._contexts_by_rank = list(contexts)
        self._ranks: list[_LocalRank] = []
        try:
            for ctx in self._contexts_by_rank:
                rank = _LocalRank(ctx)
                self._ranks.append(rank)
                # Each rank its own copy of the arguments, as a Ray actor unpickles its own: no two ranks
                # share a config, a stream's held items or a channel client.
                own_args, own_kwargs = _copied((tuple(args), dict(kwargs or {})))
                # One rank at a time: a constructor may seed and draw from torch's global generator.
                fut = rank.thread.submit(rank.construct, worker_cls, own_args, own_kwargs)
                LocalHandle([fut], [ctx.rank], self._describe, "__init__").wait()
        except BaseException:
            self.shutdown()
            raise
        log.info("launched %s in process: %d rank(s) of %s", name, len(self._ranks), worker_cls.__name__)

    @property
    def world_size(self) -> int:
        return len(self._contexts_by_rank)

    @property
    def contexts(self) -> list[WorkerContext]:
        return list(self._contexts_by_rank)

    @property
    def workers(self) -> list[Worker]:
        """The worker objects, by rank (only an in-process group can offer them)."""
        return [r.worker for r in self._ranks if r.worker is not None]

    def _describe(self, rank: int) -> tuple[str, int, str]:
        c = self._contexts_by_rank[rank]
        return self.name, rank, f"{c.node_rank} ({c.node_ip})"

    def _check_ranks(self, ranks: Sequence[int] | None) -> list[int]:
        if not self._ranks:
            raise RuntimeError(f"group {self.name!r} is shut down")
        if ranks is None:
            return list(range(self.world_size))
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad or len(set(ranks)) != len(ranks):
            raise ValueError(f"group {self.name!r} has ranks 0-{self.world_size - 1}; cannot call ranks {ranks}")
        return ranks

    def execute(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> LocalHandle:
        """Call ``method(*args, **kwargs)`` on all ranks (or ``ranks``); returns a handle at once."""
        chosen = self._check_ranks(ranks)
        futs = [self._ranks[r].thread.submit(self._ranks[r].call, method, args, kwargs) for r in chosen]
        return LocalHandle(futs, chosen, self._describe, method)

    def execute_each(self, method: str, per_rank_args: Sequence[Sequence[Any]],
                     ranks: Sequence[int] | None = None) -> LocalHandle:
        """Call ``method`` with different positional arguments on each chosen rank (scatter)."""
        chosen = self._check_ranks(ranks)
        if len(per_rank_args) != len(chosen):
            raise ValueError(f"{len(per_rank_args)} argument tuples for {len(chosen)} rank(s) of {self.name!r}")
        futs = [self._ranks[r].thread.submit(self._ranks[r].call, method, tuple(a), {})
                for r, a in zip(chosen, per_rank_args)]
        return LocalHandle(futs, chosen, self._describe, method)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> LocalHandle:
            return self.execute(method, *args, ranks=ranks, **kwargs)

        return call

    def pids(self) -> list[int]:
        """Process id of every rank: the driver's."""
        return [os.getpid()] * self.world_size

    def flush_trace(self, timeout: float = 30.0) -> None:
        """Write every rank's buffered trace events to its shard (a no-op when not traced)."""
        for rank in self._ranks:
            if rank.tracer is not None:
                rank.tracer.flush()

    def shutdown(self) -> None:
        """Stop every rank's thread and close its comm and log file (idempotent)."""
        self.flush_trace()
        for rank in self._ranks:
            rank.close()
        self._ranks = []

    def __repr__(self) -> str:
        return f"LocalGroup({self.name!r}, world_size={self.world_size})"


def _copied(value: Any) -> Any:
    """A cloudpickle round trip of ``value``: what a Ray actor receives as its constructor arguments."""
    from ray import cloudpickle

    return cloudpickle.loads(cloudpickle.dumps(value))


def local_layout(config: ClusterConfig) -> NodeLayout:
    """One node: its CUDA GPUs, else ``cpu_devices_per_node`` slots (an address is ignored)."""
    layout = expected_layout(replace(config, address=None))
    assert layout is not None
    return layout


class LocalExecutor:
    """Applies placements inside this process: one node, a thread per rank (see the module docstring)."""

    kind = "local"

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config or ClusterConfig()
        self.config.validate()
        self.cluster_id = uuid.uuid4().hex[:12]  # device lock files of this executor's ranks
        self._layout = local_layout(self.config)
        self._device_type = "cuda" if _cuda_devices() else "cpu"
        self._groups: list[LocalGroup] = []
        self._threads_before: int | None = None
        self._open = True
        inprocess.enter()

    @property
    def layout(self) -> NodeLayout:
        return self._layout

    def placement(self, spec: str | Mapping[str, str], components: Sequence[str] | None = None) -> PlacementPlan:
        return parse_placement(spec, self._layout, components)

    def _contexts(self, name: str, placement: ComponentPlacement, threads: int, log_dir: Path,
                  trace_dir: Path | None) -> list[WorkerContext]:
        ranks = placement.ranks
        if self._device_type == "cuda":
            other = sorted({d for r in ranks for d in r.local_devices} - {0})
            if other:
                raise PlacementError(
                    f"{name}: the local executor gives every rank cuda:0, the driver's first GPU; "
                    f"place it on device 0, not on {other}")
        return [WorkerContext(
            group_name=name, rank=r.rank, world_size=len(ranks), node_rank=0, node_id=NODE_ID, node_ip=NODE_IP,
            devices=r.local_devices, device_type=self._device_type, local_rank=i, local_world_size=len(ranks),
            namespace=self.config.namespace, cluster_id=self.cluster_id, num_threads=threads,
            log_dir=str(log_dir), trace_dir=str(trace_dir) if trace_dir is not None else None,
            in_process=True) for i, r in enumerate(ranks)]

    def launch(self, names: Mapping[str, str], placements: PlacementPlan | Mapping[str, Any],
               specs: Mapping[str, GroupSpec], log_dir: Path, trace_dir: Path | None = None) -> dict[str, LocalGroup]:
        """Start the groups one after another, ranks in order (all or none)."""
        if not self._open:
            raise RuntimeError("the local executor is shut down")
        contexts = {c: self._contexts(names[c], placements[c], spec.threads, log_dir, trace_dir)
                    for c, spec in specs.items()}
        self._use_threads(max((s.threads for s in specs.values()), default=1))
        groups: dict[str, LocalGroup] = {}
        try:
            for c, spec in specs.items():
                groups[c] = LocalGroup(spec.cls, names[c], placements[c], contexts[c], spec.args, spec.kwargs)
        except BaseException:
            for g in groups.values():
                g.shutdown()
            raise
        self._groups.extend(groups.values())
        return groups

    def _use_threads(self, threads: int) -> None:
        import torch

        if self._threads_before is None:
            self._threads_before = torch.get_num_threads()
        # Exactly the ranks' count, as each Ray rank process sets its own: a reduction split over
        # another number of threads can round differently.
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def shutdown(self) -> None:
        """Stop every group still running and restore the thread count."""
        if not self._open:
            return
        self._open = False
        for g in self._groups:
            g.shutdown()
        self._groups = []
        if self._threads_before is not None:
            import torch

            torch.set_num_threads(self._threads_before)
        inprocess.leave()


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
