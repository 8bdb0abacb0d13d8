"""Fault injection for recovery tests: a rank that freezes itself (SIGSTOP) on entering a chosen method.

A frozen process neither answers nor dies: its sockets stay open, Ray still counts its actor alive,
and whatever waits on it waits until a deadline says otherwise. That is the failure a dead process
(SIGKILL) does not exercise, and the one these points produce at a precise call, without racing the
run from outside.

The points come from the environment variable ``M2FLOW_FREEZE_AT`` of the process that launches the
worker groups (the driver), read when a group is launched and handed to its ranks in their context::

    M2FLOW_FREEZE_AT="/tmp/markers:rollout.generate@2,rollout.evaluate,actor.save_checkpoint"

Each point ``group.method[@N]`` names rank 0 of the group called ``group`` (or ``group-<run id>``, as
the workflows name their groups), a method called on it through the group (a hosted component's
method as ``component/method``) and the N-th such call in that process (default 1). The points are
armed in turn: only the first one without a marker file ``DIR/group.method`` is. On reaching it, the
rank creates that marker (its pid and the time, one line) and stops itself (a ``group.method`` may
appear once in a spec: its marker is its own). So each point fires
once across the restarts of a run, in the order given, and the caller finds, times and finally
kills the frozen process from the markers. Unset (the default), nothing is checked beyond one
comparison per call.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "M2FLOW_FREEZE_AT"


@dataclass(frozen=True)
class Frozen:
    """What a marker says: which process froze itself, and when (``time.time()``)."""

    pid: int
    at: float


def armed() -> str | None:
    """This process's ``M2FLOW_FREEZE_AT``, to hand to the ranks it launches (None when unset)."""
    return os.environ.get(ENV) or None


def parse(spec: str) -> tuple[Path, list[tuple[str, str, int]]]:
    """``"DIR:group.method[@N],..."`` -> (marker directory, [(group, method, N), ...])."""
    folder, _, points = spec.rpartition(":")
    if not folder or not points:
        raise ValueError(f"{ENV}={spec!r}: expected 'DIR:group.method[@N][,group.method[@N]...]'")
    out = []
    for point in points.split(","):
        target, _, nth = point.strip().partition("@")
        group, dot, method = target.partition(".")
        if not dot or not group or not method or (nth and not nth.isdigit()):
            raise ValueError(f"{ENV}: point {point!r} is not 'group.method[@N]'")
        out.append((group, method, int(nth or 1)))
    return Path(folder), out


def marker(folder: str | Path, group: str, method: str) -> Path:
    """The marker file of point ``group.method``."""
    return Path(folder) / f"{group}.{method.replace('/', '_')}"


def read_marker(path: str | Path) -> Frozen:
    pid, at = Path(path).read_text().split()
    return Frozen(int(pid), float(at))


_CALLS: dict[str, int] = {}
"""method -> calls of it seen in this process (counted only while armed)."""


def freeze_if_armed(spec: str | None, group: str, rank: int, method: str) -> None:
    """Stop this process (SIGSTOP) if ``spec``'s armed point is this call of ``method`` on this group's
    rank 0; writes the marker first (exclusive create: one process fires a point, once)."""
    if not spec or rank != 0:
        return
    _CALLS[method] = calls = _CALLS.get(method, 0) + 1
    folder, points = parse(spec)
    armed_now = next(((g, m, n) for g, m, n in points if not marker(folder, g, m).exists()), None)
    if armed_now is None:
        return
    prefix, name, nth = armed_now
    if name != method or calls != nth or not (group == prefix or group.startswith(prefix + "-")):
        return
    try:
        fd = os.open(marker(folder, prefix, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another process fired it first
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {time.time()!r}\n")
    os.kill(os.getpid(), signal.SIGSTOP)
