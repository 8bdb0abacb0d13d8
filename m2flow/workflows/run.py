"""Run scaffolding written once for every workflow: run directory, driver log, trace, executor, plan,
and checkpoints (save, find, resume) in one format.

A checkpoint is a directory ``run_dir/checkpoints/step_NNNNNN`` (N: the iteration the run goes on
from) holding what the workers saved and, written last, ``trainer_state.json``: the driver's own
state as JSON. Its presence marks the checkpoint complete; it is written to a temporary name, synced
and renamed, so a crash leaves either a complete marker or none. Nothing in it is unpickled.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from m2flow.config.errors import InputError
from m2flow.config.schema import option
from m2flow.planner import Plan
from m2flow.runtime.cluster import Cluster, ClusterConfig
from m2flow.runtime.errors import WorkerHungError, worker_died
from m2flow.runtime.executors import Executor, make_executor
from m2flow.workflows.stop import StopSignal
from m2flow.runtime.trace import ProcessInfo, configure_tracer, get_tracer, merge_traces, prepare_trace_dir, set_tracer

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
_ARRAY = "__ndarray__"


class CheckpointError(InputError):
    """A checkpoint that cannot be read; the message names the file."""


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_path(run_dir: str | Path, next_step: int) -> Path:
    """Where the checkpoint taken before iteration ``next_step`` goes."""
    return Path(run_dir) / CHECKPOINTS / f"step_{next_step:06d}"


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {_ARRAY: value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a trainer state")


def _decode(obj: dict[str, Any]) -> Any:
    if _ARRAY in obj:
        return np.asarray(obj[_ARRAY], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"])
    return obj


def _digests(checkpoint: Path) -> dict[str, str]:
    """SHA-256 of every file the workers saved into ``checkpoint`` (the marker excluded), by relative path."""
    out = {}
    for f in sorted(p for p in Path(checkpoint).rglob("*") if p.is_file()):
        if f.name == TRAINER_STATE or f.name.endswith(".tmp"):
            continue
        with open(f, "rb") as fh:
            out[f.relative_to(checkpoint).as_posix()] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


def write_state(checkpoint: Path, state: dict[str, Any]) -> Path:
    """Write the driver's state into ``checkpoint`` atomically, with the checksum of every file the
    workers saved there (so corruption is named at load time); call it after the workers saved theirs."""
    path = Path(checkpoint) / TRAINER_STATE
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump({**state, "files": _digests(Path(checkpoint))}, f, default=_encode, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return path


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The driver's state saved in ``checkpoint``; a missing or unreadable marker raises CheckpointError."""
    path = Path(checkpoint) / TRAINER_STATE
    try:
        state = json.loads(path.read_text(), object_hook=_decode)
    except FileNotFoundError:
        raise CheckpointError(f"{checkpoint} is not a checkpoint (no {TRAINER_STATE})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable trainer state ({e})") from None
    if not isinstance(state, dict) or "next_step" not in state:
        raise CheckpointError(f"{path}: not a trainer state (no 'next_step')")
    return state


def verify_checkpoint(checkpoint: Path) -> dict[str, Any]:
    """``read_state``, and every file the marker lists present with its checksum; else CheckpointError
    naming the file."""
    state = read_state(checkpoint)
    want = state.get("files", {})
    have = _digests(Path(checkpoint))
    for name, digest in want.items():
        if name not in have:
            raise CheckpointError(f"{Path(checkpoint) / name}: missing from the checkpoint")
        if have[name] != digest:
            raise CheckpointError(f"{Path(checkpoint) / name}: corrupted (its checksum differs from the one saved)")
    return state


def prune_checkpoints(run_dir: str | Path, keep: int | None) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints in ``run_dir`` (None or 0: keep all);
    returns the removed ones, oldest first. Incomplete directories (no marker) are left as they are."""
    if not keep:
        return []
    done = [p for p in sorted((Path(run_dir) / CHECKPOINTS).glob("step_*")) if (p / TRAINER_STATE).is_file()]
    removed = done[:-keep]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed old checkpoint %s (keep_checkpoints=%d)", path, keep)
    return removed


def find_checkpoint(resume: str | None, run_dir: str | Path) -> Path | None:
    """The checkpoint to resume from: ``resume`` itself, or with ``auto`` the newest valid one in run_dir.

    ``auto`` skips incomplete or unreadable checkpoints, saying which and why.
    """
    if resume is None:
        return None
    if resume != "auto":
        verify_checkpoint(Path(resume))  # raises naming what is wrong
        return Path(resume)
    for path in sorted((Path(run_dir) / CHECKPOINTS).glob("step_*"), reverse=True):
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            log.warning("resume: skipping %s", e)
            continue
        return path
    return None


def truncate_metrics(run_dir: str | Path, last_step: int) -> int:
    """Drop the rows of ``run_dir/metrics.jsonl`` logged after ``last_step`` (a resumed run logs them
    again); returns how many were dropped. A row that cannot be read is dropped too."""
    from m2flow.metrics.sinks import METRICS_FILE

    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            keep = json.loads(line)["step"] <= last_step
        except (ValueError, KeyError, TypeError):
            keep = False  # a line torn by a crash mid-write
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)
        log.info("resume: dropped %d metric row(s) logged after step %d", dropped, last_step)
    return dropped


# ----------------------------------------------------------------------------- waiting and restarting


def collect_horizon(it: int, max_staleness: int, drains: Callable[[int], bool]) -> int:
    """The last iteration whose generation (collection) may have started by step ``it`` under bounded
    staleness: ``it + max_staleness``, but none past an iteration after which nothing may be in flight
    (``drains``: a checkpoint, an evaluation, the last iteration). Both workflows schedule with it."""
    horizon = it
    while horizon < it + max_staleness and not drains(horizon):
        horizon += 1
    return horizon


def gather(handles: Sequence[Any], timeout: float | None = None) -> list[list[Any]]:
    """Results of every handle, in order; the first failure anywhere raises at once (the others would
    wait forever). Past ``timeout`` seconds the handles still running raise ``WorkerHungError``."""
    async def all_of() -> list[list[Any]]:
        return list(await asyncio.gather(*handles))

    async def bounded() -> list[list[Any]]:
        try:
            return await asyncio.wait_for(all_of(), timeout)
        except asyncio.TimeoutError:
            late = next(h for h in handles if not h.done())
            describe = getattr(late, "_describe", None)
            group, rank, node = describe(late.ranks[0]) if describe else ("?", late.ranks[0], "?")
            raise WorkerHungError(group, rank, node, f"{late.method}() gave no result within {timeout:g}s "
                                  "(fault_tolerance.iteration_timeout_s)") from None

    return asyncio.run(all_of() if timeout is None else bounded())


@dataclass
class FaultToleranceConfig:
    """What a run does when a worker dies or hangs."""

    max_restarts: int = option(2, "restarts of the whole flow after a worker dies or hangs, each from the newest "
                                  "valid checkpoint in run_dir (0: the run fails at once)")
    iteration_timeout_s: float | None = option(
        None, "a component that gives no result for this long within one iteration counts as hung (None: no limit)")

    def validate(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.iteration_timeout_s is not None and self.iteration_timeout_s <= 0:
            raise ValueError(f"iteration_timeout_s must be > 0 or None, got {self.iteration_timeout_s}")


R = TypeVar("R")


def run_with_restarts(attempt: Callable[[str | None, int], R], resume: str | None, run_dir: str | Path,
                      config: FaultToleranceConfig) -> R:
    """``attempt(resume, restarts)`` until it returns; after a worker died or hung, again from the newest
    valid checkpoint in ``run_dir`` (or from ``resume`` / the start when there is none), at most
    ``config.max_restarts`` times. Any other error, or one death too many, propagates."""
    restarts = 0
    while True:
        try:
            return attempt(resume, restarts)
        except Exception as error:  # noqa: BLE001 - only deaths are retried, everything else re-raised
            if not worker_died(error) or restarts >= config.max_restarts:
                raise
            restarts += 1
            first = str(error).splitlines()[0]
            if find_checkpoint("auto", run_dir) is not None:
                resume = "auto"
            elif resume is None:
                truncate_metrics(run_dir, 0)  # starting over: the rows logged so far come again
            log.warning("restart %d of %d from %s after: %s%s", restarts, config.max_restarts,
                        "the newest checkpoint" if resume == "auto" else resume or "the start", first,
                        _last_log_lines(run_dir, error))


def _last_log_lines(run_dir: str | Path, error: BaseException, lines: int = 8) -> str:
    """The end of the failed worker's own log file (``run_dir/logs/GROUP.RANK.log``), indented, if any."""
    group, rank = getattr(error, "group", None), getattr(error, "rank", None)
    path = Path(run_dir) / "logs" / f"{group}.{rank}.log"
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"\n  last lines of {path}:\n" + "\n".join(f"    {line}" for line in tail) if tail else ""


# ----------------------------------------------------------------------------- the run


class RunScaffold:
    """The parts of a run every workflow shares, as a context manager.

    On entry: the run directory, the driver's log file, the tracer when ``trace``. ``executor()``
    starts the executor the placement asks for; ``adopt(plan)`` logs the plan and saves it as
    ``plan.json``. On exit: the executor is shut down and the trace merged; a failure while merging
    never replaces the run's own error.
    """

    def __init__(self, run_dir: str | Path, *, placement: str, cluster_config: ClusterConfig,
                 cluster: Cluster | None = None, trace: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.placement = placement
        self.cluster_config = cluster_config
        self.cluster = cluster
        self.trace = trace
        self.trace_dir: Path | None = None
        self._executor: Executor | None = None
        self.stop = StopSignal()

    def __enter__(self) -> RunScaffold:
        from m2flow.runtime.logs import setup_logging

        self.run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(log_file=self.run_dir / "driver.log", console=False)
        if self.trace:
            self.trace_dir = prepare_trace_dir(self.run_dir)
            configure_tracer(self.trace_dir, ProcessInfo())
        return self

    def executor(self) -> Executor:
        """The run's executor, started on first use."""
        if self._executor is None:
            self._executor = make_executor(self.placement, self.cluster_config, self.cluster)
            self.stop.install()
        return self._executor

    def adopt(self, plan: Plan) -> Plan:
        """Log ``plan`` as a table and save it into the run directory."""
        log.info("%s", plan.table())
        plan.save(self.run_dir)
        return plan

    def __exit__(self, exc_type: type | None = None, exc: BaseException | None = None, tb: Any = None) -> None:
        try:
            if self._executor is not None:
                self._executor.shutdown()
                self._executor = None
        finally:
            self.stop.restore()
            if self.trace_dir is not None:
                self.trace_dir = None
                get_tracer().close()
                set_tracer(None)
                try:
                    merge_traces(self.run_dir)
                except Exception as e:  # noqa: BLE001 - the run's own error, if any, is the one to see
                    if exc is None:
                        raise
                    log.warning("trace not merged: %s", e)
