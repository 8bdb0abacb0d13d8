"""Where metrics go: a JSON-lines file, TensorBoard, Weights & Biases. The console sink is in ``console``.

Every sink takes one step's scalars at a time. TensorBoard and W&B are imported only when their sink
is built, so a run that does not use them never pays for (or needs) the import.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from m2flow.metrics.names import json_safe

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


@runtime_checkable
class MetricsSink(Protocol):
    """Receives the scalars of each step."""

    def write(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """Record ``metrics`` (plain numbers, names with a prefix) for ``step``."""

    def close(self) -> None:
        """Flush and release files; no writes afterwards."""


class JsonlSink:
    """``run_dir/metrics.jsonl``: one line ``{"step": n, "time": unix_s, "<name>": value, ...}`` per step.

    Appends, so a resumed run continues the same file. Non-finite values are written as null.
    """

    def __init__(self, run_dir: str | Path, filename: str = METRICS_FILE) -> None:
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step: int, metrics: Mapping[str, float | int]) -> None:
        row: dict[str, Any] = {"step": step, "time": round(time.time(), 3)}
        row.update((k, json_safe(v)) for k, v in metrics.items())
        # Flushed per line: the report may read the file while the run is still going.
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Scalars in a TensorBoard event file under ``run_dir/tensorboard``; tags keep their prefix groups."""

    def __init__(self, run_dir: str | Path, flush_secs: int = 10) -> None:
        from torch.utils.tensorboard import SummaryWriter  # heavy: imported only when used

        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def write(self, step: int, metrics: Mapping[str, float | int]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class WandbSink:
    """A Weights & Biases run; build it with ``WandbSink.create``, which skips cleanly without wandb."""

    def __init__(self, run: Any) -> None:
        self._run = run

    @classmethod
    def create(cls, run_dir: str | Path, project: str, name: str | None = None,
               config: Mapping[str, Any] | None = None, mode: str = "online") -> WandbSink | None:
        """Start a W&B run, or return None (with a log line) when ``wandb`` is not installed."""
        try:
            import wandb
        except ImportError:
            log.info("wandb is not installed; the W&B sink is skipped")
            return None
        run = wandb.init(project=project, name=name, dir=str(run_dir), mode=mode,
                         config=dict(config or {}))
        return cls(run)

    def write(self, step: int, metrics: Mapping[str, float | int]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()
