"""Checkpoints, written once for every workflow: save, find, verify, prune, and whose run wrote them.

A checkpoint is a directory ``run_dir/checkpoints/step_NNNNNN`` (N: the iteration the run goes on
from) holding what the workers saved and, written last, ``trainer_state.json``: the driver's own
state as JSON. Its presence marks the checkpoint complete; it is written to a temporary name, synced
and renamed, so a crash leaves either a complete marker or none. Nothing in it is unpickled.

Every checkpoint carries the identity of the run that wrote it (``RunIdentity``): a restart after a
worker died resumes only checkpoints of its own run, and ``resume: auto`` only those of a run of the
same config and seed, so a run can never continue another run's state by accident.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from m2flow.config.errors import InputError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
_ARRAY = "__ndarray__"


class CheckpointError(InputError):
    """A checkpoint that cannot be read; the message names the file."""


@dataclass(frozen=True)
class RunIdentity:
    """Who wrote a checkpoint: the workflow, a hash of the config (without the keys that only say how and
    how long it runs), the seed, and a fresh id per run."""

    workflow: str
    config: str
    seed: int
    run_id: str

    @staticmethod
    def new(workflow: str, config_hash: str, seed: int) -> RunIdentity:
        return RunIdentity(workflow, config_hash, int(seed), uuid.uuid4().hex[:12])

    def to_dict(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "config": self.config, "seed": self.seed, "run_id": self.run_id}

    def same_config(self, other: dict[str, Any] | None) -> bool:
        """Whether a checkpoint's identity is a run of this workflow, config and seed."""
        return (isinstance(other, dict) and other.get("workflow") == self.workflow
                and other.get("config") == self.config and other.get("seed") == self.seed)

    def same_run(self, other: dict[str, Any] | None) -> bool:
        """Whether a checkpoint's identity is this very run."""
        return self.same_config(other) and other.get("run_id") == self.run_id  # type: ignore[union-attr]

    def continuing(self, other: dict[str, Any] | None) -> RunIdentity:
        """This identity carrying the run id of the checkpoint it resumes (a resumed run is the same run)."""
        run_id = other.get("run_id") if isinstance(other, dict) else None
        return RunIdentity(self.workflow, self.config, self.seed, run_id) if isinstance(run_id, str) else self

    def difference(self, other: dict[str, Any] | None, same_run: bool = False) -> str:
        """Why ``other`` is not accepted, in a few words."""
        if not isinstance(other, dict):
            return "it records no run identity"
        for key, what in (("workflow", "another workflow"), ("seed", "another seed"), ("config", "another config")):
            if other.get(key) != getattr(self, key):
                return f"{what}: {other.get(key)!r}"
        return f"run {other.get('run_id')!r}, not this run {self.run_id!r}" if same_run else "the same config"


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


def find_checkpoint(resume: str | None, run_dir: str | Path, identity: RunIdentity | None = None,
                    *, same_run: bool = False) -> Path | None:
    """The checkpoint to resume from: ``resume`` itself, or with ``auto`` the newest valid one in run_dir
    that ``identity`` accepts (``same_run``: written by this very run, as a restart needs; else by a run of
    the same config and seed).

    ``auto`` skips incomplete, unreadable and other runs' checkpoints, saying which and why. A path is
    taken whoever wrote it, saying so when another run did.
    """
    if resume is None:
        return None
    if resume != "auto":
        state = verify_checkpoint(Path(resume))  # raises naming what is wrong
        if identity is not None and not identity.same_config(state.get("identity")):
            log.warning("resume: %s was written by another run (%s); continuing it as asked",
                        resume, identity.difference(state.get("identity")))
        return Path(resume)
    for path in sorted((Path(run_dir) / CHECKPOINTS).glob("step_*"), reverse=True):
        try:
            state = verify_checkpoint(path)
        except CheckpointError as e:
            log.warning("resume: skipping %s", e)
            continue
        if identity is not None:
            accepted = identity.same_run(state.get("identity")) if same_run else identity.same_config(state.get("identity"))
            if not accepted:
                log.warning("resume: skipping %s: written by another run (%s)", path,
                            identity.difference(state.get("identity"), same_run))
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
