"""The process behind one rank of a ``WorkerGroup``: a Ray actor that builds the worker and runs its calls.

A host serves one rank at a time. When its group shuts down cleanly, ``release`` takes the worker apart and
puts the process back as it started (environment, CPU affinity, torch's global state, logging, tracing,
the garbage collector); a later group on the same node can then ``reset`` it for one of its ranks instead of
starting a process that imports torch and transformers again (``host_pool.py``). A host that cannot prove
itself clean (a call still running, a thread or a child process its worker left behind) says so, and is
killed instead.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from m2flow.runtime import lasting
from m2flow.runtime.auth import adopt
from m2flow.runtime.faults import freeze_if_armed
from m2flow.runtime.handle import CallFailure
from m2flow.runtime.logs import setup_logging
from m2flow.runtime.rank_core import build_worker, failure, run_method
from m2flow.runtime.trace import ProcessInfo, configure_tracer, get_tracer, set_tracer
from m2flow.runtime.worker import Worker, WorkerContext, apply_thread_limits

log = logging.getLogger(__name__)

IDLE_TITLE = "ray::m2flow-idle-host"
"""What ``ps`` shows for a released host waiting in the pool."""

THREAD_GRACE_S = 2.0
"""How long ``release`` waits for the threads of a closed worker to end."""

PROCESS_THREADS = frozenset({"tqdm_monitor"})
"""Threads a library starts once for the whole process (tqdm's progress-bar monitor): not a worker's."""


RANK_ENV = "M2FLOW_RANK"
"""Names the rank a process serves (``group:rank``), for messages that name the process (a channel's
producer or consumer); the process's Ray name is the one it was created with, which a reused process keeps."""


def process_env(ctx: WorkerContext) -> dict[str, str]:
    """The environment variables a rank's process gets from its context."""
    env = {"OMP_NUM_THREADS": str(ctx.num_threads), "MKL_NUM_THREADS": str(ctx.num_threads),
           RANK_ENV: f"{ctx.group_name}:{ctx.rank}"}
    if ctx.device_type == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in ctx.devices)
    return env


class RankHost:
    """The Ray actor behind one rank: owns the worker object and reports failures with context."""

    def __init__(self, ctx: WorkerContext, secret: str | None = None, serving: str = "") -> None:
        # What the process was before any rank touched it, for ``release`` to put back.
        self._start_env = dict(os.environ)
        self._start_affinity = os.sched_getaffinity(0)
        self._start_threads = {t.ident for t in threading.enumerate()}
        self._running = 0
        self._lock = threading.Lock()
        self.worker: Worker | None = None
        self._serve(ctx, secret, serving)

    def _serve(self, ctx: WorkerContext, secret: str | None, serving: str) -> None:
        self.ctx = ctx
        # The group this process serves: a call or a construction made for another (a group that shut
        # down, whose late calls may still reach the process after it was handed to the next) is refused.
        self.serving = serving
        adopt(secret)  # before any listener starts: peers must prove they hold the run's secret
        # Set in-process rather than through a Ray runtime_env, which costs a slower worker start;
        # nothing has touched CUDA or built torch's thread pool yet at this point.
        os.environ.update(process_env(ctx))
        apply_thread_limits(ctx.num_threads)
        log_file = Path(ctx.log_dir) / f"{ctx.group_name}.{ctx.rank}.log" if ctx.log_dir else None
        setup_logging(log_file=log_file, console=ctx.rank == 0,
                      prefix=f"[{ctx.group_name}:{ctx.rank}] ")
        if ctx.trace_dir:
            configure_tracer(ctx.trace_dir, ProcessInfo(
                ctx.group_name, ctx.rank, ctx.node_rank, ctx.devices, ctx.device_type))
        keep_process_title(f"ray::{ctx.group_name}[{ctx.rank}]")

    # -- one rank's life ------------------------------------------------------------------------
    def _failure(self, exc: BaseException) -> CallFailure:
        return failure(self.ctx, exc)

    def free_port(self) -> int:
        """A free port on this rank's own address, where rank 0 will serve torch's store."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self.ctx.node_ip, 0))
            return s.getsockname()[1]

    def construct(self, serving: str, master_addr: str, master_port: int, cls: type[Worker],
                  args: tuple, kwargs: dict) -> Any:
        if serving != self.serving:
            return self._failure(_not_serving(serving))
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

    def call(self, serving: str, method: str, args: tuple, kwargs: dict) -> Any:
        # The fault-injection point of recovery tests (off unless the launching process armed it).
        freeze_if_armed(self.ctx.freeze_at, self.ctx.group_name, self.ctx.rank, method)
        with self._lock:  # counted and checked at once: ``release`` takes the worker under the same lock
            self._running += 1
            worker = self.worker if serving == self.serving else None
        try:
            if worker is None and serving != self.serving:
                raise _not_serving(serving)
            return run_method(worker, method, args, kwargs)
        except BaseException as e:  # noqa: BLE001
            return self._failure(e)
        finally:
            with self._lock:
                self._running -= 1

    def flush_trace(self) -> int:
        return get_tracer().flush()

    def context(self) -> WorkerContext:
        return self.ctx

    def serving_token(self) -> str:
        """What calls for the group this process serves carry (for a view attached by the group's name)."""
        return self.serving

    def pid(self) -> int:
        return os.getpid()

    # -- reuse ----------------------------------------------------------------------------------
    def reset(self, ctx: WorkerContext, secret: str | None = None, serving: str = "") -> int:
        """Serve ``ctx``'s rank from now on (a released host taken from the pool); returns the pid."""
        if self.worker is not None:
            raise RuntimeError(f"this host still serves {self.ctx.group_name}[{self.ctx.rank}]")
        self._serve(ctx, secret, serving)
        return os.getpid()

    def release(self) -> str:
        """Take the worker apart and put the process back as it started; ``""`` when it is clean and may
        serve another rank, else why not (the caller then kills it)."""
        with self._lock:
            if self._running:
                return f"{self._running} call(s) still running"
            worker, self.worker = self.worker, None
            self.serving = ""
        # torch's DTensor caches shard offsets by device mesh, and two ranks' meshes compare equal: a process
        # that served one rank of a sharded group would hand a later rank the first rank's offsets.
        ranks = _distributed_world()
        try:
            if worker is not None:
                close_worker(worker)
        except Exception as e:  # noqa: BLE001 - a worker that cannot close is not reused
            return f"closing the worker failed: {e!r}"
        if ranks > 1:
            return f"it joined a torch.distributed group of {ranks} ranks"
        del worker
        gc.unfreeze()
        gc.collect()
        tracer = set_tracer(None)
        tracer.close()
        restore_torch()
        os.environ.clear()
        os.environ.update(self._start_env)
        os.sched_setaffinity(0, self._start_affinity)
        setup_logging(console=False)
        keep_process_title(IDLE_TITLE)
        left = self._leftovers()
        return f"left behind: {left}" if left else ""

    def _leftovers(self) -> str:
        """Threads and child processes the worker started and that still run, after a short grace."""
        deadline = time.monotonic() + THREAD_GRACE_S
        while True:
            threads = [t.name for t in threading.enumerate()
                       if t.ident not in self._start_threads and t.is_alive() and t.name not in PROCESS_THREADS
                       and not isinstance(t, threading._DummyThread)]  # Ray's own call threads
            children = sorted(set(_children()) - lasting.children())
            if not (threads or children) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        parts = ([f"threads {threads}"] if threads else []) + ([f"child processes {children}"] if children else [])
        return ", ".join(parts)


def _not_serving(serving: str) -> RuntimeError:
    return RuntimeError(f"this process no longer serves the group that made this call ({serving})")


def close_worker(worker: Worker) -> None:
    """Close what a worker holds: its own ``close`` (and its hosted parts'), its communicator, and
    ``torch.distributed`` when it joined a process group."""
    for part in [*worker.hosted_parts(), worker]:
        close = getattr(part, "close", None)
        if callable(close):
            close()
    comm = getattr(worker, "_m2flow_comm", None)
    if comm is not None:
        comm.close()
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _distributed_world() -> int:
    """The size of the torch.distributed group this process joined (0: none)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_world_size()


def restore_torch() -> None:
    """Torch's process-wide state as a new process has it: the default generator seeded afresh (a new
    process draws a random seed), no compiled graphs (a reused process would otherwise reach dynamo's
    recompile limit and fall back to eager)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.seed()
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def _children() -> list[int]:
    """Live child processes of this process (zombies are reaped first)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(pids))


def pin_to_devices(devices: Sequence[int]) -> None:
    """Pin this process to the cores of CPU device slots ``devices`` (slot d: the d-th of the cores it may use,
    modulo their number)."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[d % len(allowed)] for d in devices})


_title: list[str] = [IDLE_TITLE]


def keep_process_title(idle: str) -> None:
    """Title this process ``idle`` between calls, where Ray would put back ``ray::RankHost``.

    Ray titles a worker process after each task it runs and, once the task returns, after the actor's
    class; it does both through ``ray._private.worker._changeproctitle(title, next_title)``, looked up
    at each task. Wrapping it keeps the task's own title during a call (``ray::group[rank].method``)
    and names the rank afterwards. Takes effect from the end of the next call (the host's first call,
    ``construct``, follows at once). Should Ray drop that function, titles are Ray's again: nothing
    else depends on them.
    """
    from ray._private import worker as ray_worker

    _title[0] = idle
    change = getattr(ray_worker, "_changeproctitle", None)
    if change is None or getattr(change, "m2flow_idle", None) is not None:
        return

    def changeproctitle(title: str, next_title: str) -> Any:
        return change(title, _title[0])

    changeproctitle.m2flow_idle = True  # type: ignore[attr-defined]
    ray_worker._changeproctitle = changeproctitle
