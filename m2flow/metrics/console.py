"""The console sink: one rich progress bar with ETA and the key metrics of the latest step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def format_value(value: float | int) -> str:
    """Short form for the progress line: integers as is, floats with 4 significant digits."""
    return str(value) if isinstance(value, int) else f"{value:.4g}"


class ConsoleSink:
    """Progress bar (steps done / total, elapsed, ETA) followed by ``name=value`` for key metrics.

    Shows ``key_metrics`` when given, else the first ``max_shown`` names of the first step logged.
    """

    def __init__(self, total_steps: int | None = None, description: str = "train",
                 key_metrics: Sequence[str] = (), max_shown: int = 4, console: Any = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.total_steps = total_steps
        self.key_metrics = list(key_metrics)
        self.max_shown = max_shown
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[shown]}"), console=console,
        )
        self._task = self._progress.add_task(description, total=total_steps, shown="")
        self._started = False
        self._done = 0

    @property
    def console(self) -> Any:
        """The rich console the bar draws on (print summaries through it to keep the bar intact)."""
        return self._progress.console

    def shown(self, metrics: Mapping[str, float | int]) -> str:
        """The ``name=value`` text for one step."""
        if not self.key_metrics:
            self.key_metrics = list(metrics)[: self.max_shown]
        return "  ".join(f"{k}={format_value(metrics[k])}" for k in self.key_metrics if k in metrics)

    def write(self, step: int, metrics: Mapping[str, float | int]) -> None:
        if not self._started:
            self._progress.start()
            self._started = True
        # Steps may count from 0 or 1, or resume midway: a resumed run's first step moves the bar
        # to where it resumed, every later one advances it by one.
        self._done = max(self._done + 1, step)
        if self.total_steps is not None:
            self._done = min(self._done, self.total_steps)
        self._progress.update(self._task, completed=self._done, shown=self.shown(metrics))

    def close(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False
