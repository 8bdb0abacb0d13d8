"""Run reward checks under a time limit, in worker processes that may hang or die without harm.

``SandboxPool`` keeps a few long-lived worker processes. Each call gets a deadline; a worker that
misses it is killed and replaced, a worker that dies (segfault, ``os._exit``, out of memory) is
replaced, and an exception inside a check is caught. (In a confined worker the host keeps the
deadline and replaces its worker process itself, by a fork inside the sandbox.) None of these reach the caller: the call's
result is marked ``timeout``/``crash``/``error`` and counted in ``VerifyStats``.

``score_batch`` is the batch API for math rewards. It decides in the caller's process only what
needs no parsing (``quick_verify``: both answers plain integers, as in GSM8K's ``#### N``) and sends
the rest to the pool, where math-verify parses and compares under the pool's time limit. The pool's
deadline is the only time limit: math-verify's own (``signal.alarm``) is off, see ``math_verify.py``.

Workers are confined (``isolation``, see ``confine.py``): each is a host process started fresh inside
a sandbox that shows the file system read-only (code only: no home, no run directory), a private
``/tmp``, no network and no other process, with an environment that holds no secret of the run
(``sandbox_host.py``). With ``isolation="auto"`` a machine that offers no sandbox (neither bubblewrap
nor unprivileged user namespaces) gets unconfined workers and a warning: a reward check reads the
model's text, it does not run it (the python tool, which does, refuses instead). Unconfined workers
(``isolation="none"``) are started with the ``forkserver`` method: forking the training process itself
would copy its threads' locks (torch, Ray) into the child, and ``spawn`` re-imports sympy and the LaTeX
parser per worker.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

from m2flow.rewards.confine import Isolation, resolve, why_unavailable
from m2flow.runtime import lasting
from m2flow.rewards.sandbox_host import HostWorker, import_module

__all__ = ["SandboxPool", "SandboxResult", "VerifyStats", "default_pool", "import_module", "score_batch"]

logger = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "crash"]
_READY = "ready"  # a new worker's first message, once its imports are done


@dataclass
class VerifyStats:
    """Counts of how checks were decided and how many failed; add them up across batches."""

    total: int = 0  # checks requested
    in_process: int = 0  # decided by the fast path (plain integers) in the caller's process
    sandboxed: int = 0  # sent to a worker process
    timeouts: int = 0  # killed at the time limit (scored 0)
    errors: int = 0  # raised an exception (scored 0)
    crashes: int = 0  # the worker process died (scored 0)
    invalid: int = 0  # returned NaN, an infinity or no number at all (scored 0)
    restarts: int = 0  # workers replaced after a timeout, a crash or recycling
    seconds: float = 0.0  # wall time spent

    def __iadd__(self, other: VerifyStats) -> VerifyStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def failures(self) -> int:
        """Checks that returned no usable score (timeouts, errors, crashes, invalid values), all scored 0."""
        return self.timeouts + self.errors + self.crashes + self.invalid

    def as_metrics(self, prefix: str = "reward/verify_") -> dict[str, float]:
        """Flat metric dict, e.g. {"reward/verify_timeouts": 0.0, ...}."""
        return {prefix + f.name: float(getattr(self, f.name)) for f in fields(self)}


@dataclass
class SandboxResult:
    """Outcome of one call: ``value`` is set only when ``status == "ok"``."""

    status: Status
    value: Any = None
    error: str = ""


def _worker_main(conn: Connection, memory_limit_mb: int | None, imports: Sequence[str] = ()) -> None:
    """Worker loop: import ``imports``, say ready, then receive (task id, fn, args) and send back
    (task id, status, payload); None stops."""
    if memory_limit_mb:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for name in imports:
        try:
            import_module(name)
        except Exception:  # noqa: BLE001 - the check itself will fail, and be counted, when it is called
            pass
    conn.send(_READY)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, fn, args = message
        try:
            reply = (task_id, "ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, none kills the loop
            reply = (task_id, "error", f"{type(exc).__name__}: {exc}"[:500])
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
            conn.send((task_id, "error", f"cannot send result: {type(exc).__name__}: {exc}"[:500]))


START_TIMEOUT_S = 120.0
"""How long a new worker may take to start and import its checks' modules (a loaded machine importing torch)."""
HOST_GRACE_S = 2.0
"""A confined host keeps each task's time limit itself; the pool kills the host only this much later."""


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: mp.context.BaseContext, memory_limit_mb: int | None, imports: Sequence[str] = ()) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child_conn, memory_limit_mb, tuple(imports)),
                                   daemon=True)
        self.process.start()
        child_conn.close()
        self.tasks_done = 0
        self.ready = False

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for the worker's imports (not part of any check's time limit); False if it died or took longer."""
        if not self.ready:
            try:
                self.ready = self.conn.poll(timeout_s) and self.conn.recv() == _READY
            except (EOFError, OSError):
                return False
        return self.ready

    def send(self, task_id: int, fn: Callable[..., Any], args: tuple[Any, ...], limit_s: float) -> None:
        self.conn.send((task_id, fn, args))

    def receive(self) -> Any:
        return self.conn.recv()

    def stop(self, kill: bool) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                self.process.kill()
        self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self.conn.close()


_warned_unconfined = False


class SandboxPool:
    """A few worker processes that run picklable top-level functions with a per-call time limit.

    ``isolation`` picks the sandbox (``auto``: bubblewrap, else namespaces, else unconfined with a
    warning). ``fresh_process_per_task`` runs each call in a process of its own forked inside the
    sandbox (the python tool); ``scratch_mb`` and ``max_processes`` bound such a task's ``/tmp`` and
    process count.
    """

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        memory_limit_mb: int | None = 4096,
        max_tasks_per_worker: int | None = 2000,
        preload: Sequence[str] = ("m2flow.rewards.math_verify",),
        isolation: Isolation = "auto",
        fresh_process_per_task: bool = False,
        scratch_mb: int = 64,
        max_processes: int = 32,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        # Recycling bounds the growth of sympy's and the parser's caches in long runs.
        self.max_tasks_per_worker = max_tasks_per_worker
        self.backend = resolve(isolation)
        if self.backend is None and isolation == "auto":
            _warn_unconfined()
        self.fresh_process_per_task = fresh_process_per_task
        self.scratch_mb = scratch_mb
        self.max_processes = max_processes
        self._ctx = mp.get_context("forkserver")
        if self.backend is None:
            # Loaded once in the fork server, so a replacement worker starts in milliseconds.
            self._ctx.set_forkserver_preload(list(preload))
        self._lock = threading.Lock()
        self._task_ids = itertools.count()
        # Modules the workers import before they say ready (those of the checks seen so far), so a
        # check's time limit never pays for importing its own module. A confined host starts from
        # nothing: it imports the preloads as well.
        self._imports: list[str] = [] if self.backend is None else list(preload)
        self.start_timeout_s = START_TIMEOUT_S
        self._workers = [self._new_worker() for _ in range(num_workers)]
        self._closed = False

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def pids(self) -> list[int]:
        """The process ids of the pool's workers (none once closed)."""
        return [] if self._closed else [w.process.pid for w in self._workers]

    def _new_worker(self) -> _Worker | HostWorker:
        if self.backend is None:
            return _Worker(self._ctx, self.memory_limit_mb, self._imports)
        # A fresh task process sets its own memory limit; a host that runs checks itself has the pool's.
        return HostWorker(self.backend, list(self._imports), fresh=self.fresh_process_per_task,
                          memory_limit_mb=self.memory_limit_mb, scratch_mb=self.scratch_mb,
                          max_processes=self.max_processes, max_tasks=self.max_tasks_per_worker)

    def _replace(self, worker: _Worker | HostWorker, kill: bool) -> _Worker | HostWorker:
        worker.stop(kill=kill)
        fresh = self._new_worker()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def _warm_up(self, module: str, stats: VerifyStats) -> None:
        """Import ``module`` in every worker now and in every later one at its start, outside any time limit."""
        self._imports.append(module)
        self._run_locked(import_module, [(module,)] * len(self._workers), self.start_timeout_s, stats)
        for worker in self._workers:
            worker.tasks_done = 0  # an import is not a check: recycling counts checks

    def map(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], timeout_s: float | None = None
    ) -> tuple[list[SandboxResult], VerifyStats]:
        """Run ``fn(*args)`` for each args tuple across the workers; never raises for a bad call."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        try:
            pickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - pickling can fail with many exception types
            raise TypeError(f"sandboxed checks must be picklable top-level functions, got {fn!r}") from exc
        limit = self.timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        stats = VerifyStats(total=len(calls), sandboxed=len(calls))
        module = getattr(fn, "__module__", None)
        with self._lock:
            if module and module not in self._imports and module != __name__:
                warm = VerifyStats()
                self._warm_up(module, warm)
                stats.restarts += warm.restarts
            results = self._run_locked(fn, calls, limit, stats)
        stats.seconds = time.perf_counter() - start
        return results, stats

    def _run_locked(self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], limit: float,
                    stats: VerifyStats) -> list[SandboxResult]:
        """``map``'s loop, the lock held."""
        results: list[SandboxResult | None] = [None] * len(calls)
        pending = deque(enumerate(calls))
        busy: dict[Any, tuple[int, int, float]] = {}  # worker -> (call index, task id, deadline)
        grace = HOST_GRACE_S if self.backend is not None else 0.0
        while pending or busy:
            for worker in list(self._workers):
                if not pending:
                    break
                if worker in busy:
                    continue
                if not worker.process.is_alive():  # died while idle: replace quietly
                    worker = self._replace(worker, kill=True)
                    stats.restarts += 1
                if not worker.wait_ready(self.start_timeout_s):
                    failure = getattr(worker, "failure", "")
                    raise RuntimeError(f"a sandbox worker did not start within {self.start_timeout_s:g}s "
                                       f"(exit code {worker.process.exitcode}{': ' + failure if failure else ''})")
                index, args = pending.popleft()
                task_id = next(self._task_ids)
                try:
                    worker.send(task_id, fn, tuple(args), limit)
                except OSError:  # the worker died since the check above: retry on a fresh one
                    pending.appendleft((index, args))
                    self._replace(worker, kill=True)
                    stats.restarts += 1
                    continue
                busy[worker] = (index, task_id, time.monotonic() + limit + grace)
            if busy:
                self._collect(busy, results, stats)
        return [r if r is not None else SandboxResult("crash") for r in results]

    def _collect(
        self,
        busy: dict[Any, tuple[int, int, float]],
        results: list[SandboxResult | None],
        stats: VerifyStats,
    ) -> None:
        """Wait for the first reply, death or deadline among busy workers and record it."""
        next_deadline = min(deadline for _, _, deadline in busy.values())
        handles: list[Any] = [w.conn for w in busy] + [w.process.sentinel for w in busy]
        ready = set(wait(handles, timeout=max(0.0, next_deadline - time.monotonic())))
        now = time.monotonic()
        for worker, (index, task_id, deadline) in list(busy.items()):
            reply, dead = None, False
            if worker.conn in ready or worker.conn.poll():
                try:
                    reply = worker.receive()
                except (EOFError, OSError, pickle.UnpicklingError):  # a confined host's reply is not trusted
                    dead = True
            if reply is not None and (not isinstance(reply, tuple) or len(reply) != 3):
                reply, dead = None, True  # a forged reply: the host is not to be trusted any longer
            if reply is not None and reply[0] != task_id:
                continue  # a stale reply from a call interrupted earlier: keep waiting
            if reply is not None:
                _, status, payload = reply
                if status == "ok":
                    results[index] = SandboxResult("ok", value=payload)
                elif status in ("timeout", "crash"):  # a confined host replaced the task's process
                    results[index] = SandboxResult(status, error=str(payload))
                    if status == "timeout":
                        stats.timeouts += 1
                    else:
                        stats.crashes += 1
                    stats.restarts += 1
                    logger.warning("sandboxed task %d: %s", index, payload)
                else:
                    results[index] = SandboxResult("error", error=str(payload))
                    stats.errors += 1
                    logger.debug("sandboxed check %d raised: %s", index, payload)
                del busy[worker]
                # A host that replaced the task's process after a timeout or crash starts its count anew.
                worker.tasks_done = 0 if status in ("timeout", "crash") else worker.tasks_done + 1
                if self.max_tasks_per_worker and worker.tasks_done >= self.max_tasks_per_worker:
                    if isinstance(worker, HostWorker):  # the host recycles its worker process at the same count
                        worker.tasks_done = 0
                    else:
                        self._replace(worker, kill=False)
                    stats.restarts += 1
            elif dead or worker.process.sentinel in ready or not worker.process.is_alive():
                worker.process.join(timeout=1.0)
                results[index] = SandboxResult("crash", error=f"worker exit code {worker.process.exitcode}")
                stats.crashes += 1
                logger.warning("reward check %d crashed its worker (exit %s)", index, worker.process.exitcode)
                del busy[worker]
                self._replace(worker, kill=True)
                stats.restarts += 1
            elif now >= deadline:
                results[index] = SandboxResult("timeout", error="no answer within the time limit")
                stats.timeouts += 1
                logger.warning("reward check %d hit the time limit; restarting its worker", index)
                del busy[worker]
                self._replace(worker, kill=True)
                stats.restarts += 1

    def close(self) -> None:
        """Stop every worker; the pool cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.stop(kill=False)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()


def _warn_unconfined() -> None:
    global _warned_unconfined
    if not _warned_unconfined:
        _warned_unconfined = True
        logger.warning("reward checks run unconfined: no sandbox on this machine (%s)", why_unavailable())


def _default_workers() -> int:
    """Workers of the default pool: two, or one where this process has a single thread's share of the cores
    (``OMP_NUM_THREADS``, which a worker rank sets to its share): a second host there would only compete
    for the same core, and each host costs seconds of CPU to start (it imports sympy and math-verify)."""
    share = os.environ.get("OMP_NUM_THREADS", "")
    cores = int(share) if share.isdigit() and int(share) > 0 else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def default_pool() -> SandboxPool:
    """The process-wide pool used when ``score_batch`` gets none (created on first use)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            _default_pool = SandboxPool(num_workers=_default_workers())
            atexit.register(_default_pool.close)
            # The pool serves any rank this process hosts, one after another: a reused process keeps it.
            lasting.add(_default_pool.pids)
        return _default_pool


def score_batch(
    responses: Sequence[str],
    references: Sequence[str],
    *,
    pool: SandboxPool | None = None,
    timeout_s: float | None = None,
    in_process_fast_path: bool = True,
    check: Callable[[str, str], float | bool] | None = None,
) -> tuple[list[float], VerifyStats]:
    """Scores (B,) in {0.0, 1.0} (or ``check``'s floats) for B responses against B references.

    ``check`` replaces math verification with any picklable top-level function run in the
    sandbox; failures (timeout, error, crash) score 0.0 and are counted, never raised.
    """
    if len(responses) != len(references):
        raise ValueError(f"{len(responses)} responses but {len(references)} references")
    # Here, not at the top: a process that only runs the pool's workers (the python tool's fork
    # server, whose every process is forked from it) need not carry sympy.
    from m2flow.rewards.math_verify import quick_verify, verify_answer

    start = time.perf_counter()
    scores = [0.0] * len(responses)
    todo: list[int] = []
    stats = VerifyStats(total=len(responses))
    for i, (response, reference) in enumerate(zip(responses, references)):
        decided = quick_verify(response, reference) if in_process_fast_path and check is None else None
        if decided is None:
            todo.append(i)
        else:
            scores[i] = 1.0 if decided else 0.0
            stats.in_process += 1
    if todo:
        pool = pool or default_pool()
        fn = check or verify_answer
        results, pool_stats = pool.map(fn, [(responses[i], references[i]) for i in todo], timeout_s=timeout_s)
        pool_stats.total = 0  # already counted above
        stats += pool_stats
        for i, result in zip(todo, results):
            if result.status != "ok":
                continue
            try:
                scores[i] = float(result.value)
            except (TypeError, ValueError):
                stats.invalid += 1
                logger.warning("reward check returned a %s, not a number; scored 0", type(result.value).__name__)
    stats.seconds = time.perf_counter() - start
    return scores, stats
