"""Helpers of the frozen-rank tests: arm the fault-injection points, time each freeze to its restart, and
leave no process stopped behind."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from m2flow.runtime.faults import ENV, Frozen, marker, parse, read_marker


@dataclass(frozen=True)
class Caught:
    """One armed point: when its rank froze, and the restart that followed (``time.time()`` seconds)."""

    point: str
    frozen: Frozen
    restart_at: float
    message: str

    @property
    def seconds(self) -> float:
        """From the stop to the restart."""
        return self.restart_at - self.frozen.at


class _Restarts(logging.Handler):
    """Collects the driver's "restart N of M after: ..." records."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("restart "):
            self.records.append(record)


class FreezePlan:
    """The points armed for one run (``group.method[@N]``, fired in this order) and what became of them."""

    def __init__(self, folder: Path, points: list[str]) -> None:
        self.folder, self.points = folder, points
        self.spec = f"{folder}:{','.join(points)}"
        self._restarts = _Restarts()

    def caught(self) -> list[Caught]:
        """Every point that fired, with the first restart after it."""
        _, parsed = parse(self.spec)
        out = []
        for point, (group, method, _) in zip(self.points, parsed):
            path = marker(self.folder, group, method)
            if not path.exists():
                continue
            frozen = read_marker(path)
            after = [r for r in self._restarts.records if r.created >= frozen.at]
            out.append(Caught(point, frozen, after[0].created if after else float("inf"),
                              after[0].getMessage() if after else "no restart"))
        return out

    def release(self) -> None:
        """SIGKILL every process that froze itself and is still there (stopped, so it never exits alone)."""
        for path in self.folder.glob("*"):
            try:
                pid = read_marker(path).pid
                if "ray::" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    continue  # gone, and the pid taken by something else
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone already


@contextmanager
def freezing(tmp_path: Path, monkeypatch, points: list[str]) -> Iterator[FreezePlan]:
    """Arm ``points`` for the groups launched inside the block; afterwards nothing is left frozen."""
    folder = tmp_path / "frozen"
    folder.mkdir()
    plan = FreezePlan(folder, points)
    monkeypatch.setenv(ENV, plan.spec)
    restarts = logging.getLogger("m2flow.driver.restarts")
    restarts.addHandler(plan._restarts)
    try:
        yield plan
    finally:
        restarts.removeHandler(plan._restarts)
        monkeypatch.delenv(ENV)
        plan.release()
