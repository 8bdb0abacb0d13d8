"""``MetricsLogger``: checks metric names, turns values into numbers, and fans each step out to sinks.

Only the main process logs: rank 0 of a group (``RANK`` unset or ``0``) or the driver. Elsewhere the
logger accepts calls and does nothing, so workflow code needs no rank checks around it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.config.schema import option
from m2flow.metrics.console import ConsoleSink
from m2flow.metrics.names import NameChecker, UnknownPrefixPolicy, scalars
from m2flow.metrics.sinks import JsonlSink, MetricsSink, TensorBoardSink, WandbSink

log = logging.getLogger(__name__)

SINK_NAMES = ("console", "jsonl", "tensorboard", "wandb")


@dataclass
class MetricsConfig:
    """Where a run's metrics go."""

    sinks: list[str] = option(["console", "jsonl", "tensorboard"],
                              "sinks to write to: console, jsonl, tensorboard, wandb")
    unknown_prefix: UnknownPrefixPolicy = option(
        "warn", "a metric name without a known prefix: 'warn' once per name, or 'error'")
    key_metrics: list[str] = option([], "metrics shown on the progress line (empty: the first few)")
    extra_prefixes: list[str] = option([], "metric groups a workflow logs besides the known ones (runtime_demo/)")
    wandb_project: str = option("m2flow", "W&B project (used when 'wandb' is in sinks)")
    wandb_mode: str = option("online", "W&B mode: online, offline or disabled")

    def validate(self) -> None:
        bad = [s for s in self.sinks if s not in SINK_NAMES]
        if bad:
            raise ValueError(f"sinks: unknown sink(s) {bad}; valid: {', '.join(SINK_NAMES)}")
        if len(set(self.sinks)) != len(self.sinks):
            raise ValueError(f"sinks: listed twice in {self.sinks}")


def is_main_process() -> bool:
    """True on the driver and on rank 0 of a worker group (from the ``RANK`` variable)."""
    return os.environ.get("RANK", "0") == "0"


class MetricsLogger:
    """Logs one dict of scalars per step to every configured sink."""

    def __init__(
        self,
        run_dir: str | Path,
        config: MetricsConfig | None = None,
        *,
        total_steps: int | None = None,
        description: str = "train",
        extra_prefixes: Iterable[str] = (),
        run_config: Mapping[str, Any] | None = None,
        is_main: bool | None = None,
        sinks: Sequence[MetricsSink] | None = None,
    ) -> None:
        self.config = config or MetricsConfig()
        self.config.validate()
        self.run_dir = Path(run_dir)
        self.checker = NameChecker(self.config.unknown_prefix, [*self.config.extra_prefixes, *extra_prefixes])
        self.active = is_main_process() if is_main is None else is_main
        self.console: ConsoleSink | None = None
        self.sinks: list[MetricsSink] = []
        if not self.active:
            return
        if sinks is not None:
            self.sinks = list(sinks)
            return
        for name in self.config.sinks:
            sink = self._build(name, total_steps, description, run_config)
            if sink is not None:
                self.sinks.append(sink)

    def _build(self, name: str, total_steps: int | None, description: str,
               run_config: Mapping[str, Any] | None) -> MetricsSink | None:
        if name == "console":
            self.console = ConsoleSink(total_steps, description, self.config.key_metrics)
            return self.console
        if name == "jsonl":
            return JsonlSink(self.run_dir)
        if name == "tensorboard":
            try:
                return TensorBoardSink(self.run_dir)
            except ImportError as e:
                log.warning("TensorBoard sink skipped: %s", e)
                return None
        return WandbSink.create(self.run_dir, self.config.wandb_project, self.run_dir.name,
                                run_config, self.config.wandb_mode)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Check the names, convert the values to numbers, and write one step to every sink."""
        if not self.active:
            return
        for name in metrics:
            self.checker.check(name)
        values = scalars(metrics)
        for sink in self.sinks:
            sink.write(step, values)

    def print(self, *objects: Any) -> None:
        """Print on the main process, through the progress bar's console when there is one."""
        if not self.active:
            return
        if self.console is not None:
            self.console.console.print(*objects)
        else:
            from rich.console import Console

            Console().print(*objects)

    def close(self) -> None:
        """Flush and close every sink."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001 - one failing sink must not hide the others' data
                log.warning("closing %s failed: %s", type(sink).__name__, e)
        self.sinks = []

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
