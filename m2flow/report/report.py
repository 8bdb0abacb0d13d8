"""Build a run report: analyse the trace and metrics of a run dir, write ``report.json`` and PNGs."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m2flow.report.analysis import Analysis, analyse
from m2flow.report.load import RunData, load_run
from m2flow.report.plots import write_plots

log = logging.getLogger(__name__)

REPORT_FILE = "report.json"
STEP_TIME_METRIC = "time/step"


@dataclass
class Report:
    """A run's analysis plus what was written for it."""

    run: RunData
    analysis: Analysis
    measured_step_time: float | None  # sum of the ``time/step`` metric over the analysed steps
    plots: list[Path] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Every number of the report, JSON-ready (seconds and fractions)."""
        a = self.analysis
        total = a.total_time
        components = [
            {"name": name, "wall_s": wall, "share": wall / total if total else 0.0,
             "busy_s": a.busy_by_component.get(name, 0.0)}
            for name, wall in a.totals().items()
        ]
        devices = [
            {"device": d.label, "processes": d.processes, "busy_fraction": d.busy_fraction,
             "busy_s": d.busy, "window_s": d.window, "bubbles": len(d.bubbles),
             "bubble_s": d.bubble_time,
             "longest_bubble_s": max((b - a_ for a_, b in d.bubbles), default=0.0)}
            for d in a.devices
        ]
        return {
            "run_dir": str(self.run.run_dir),
            "iterations": len(a.steps),
            "iteration_time_s": total,
            "measured_step_time_s": self.measured_step_time,
            "attribution": "each instant of an iteration goes to the busiest active component; "
                           "idle when no worker is in a span",
            "components": components,
            "steps": [{"index": s.index, "start_s": s.start, "duration_s": s.duration,
                       "parts": s.parts} for s in a.steps],
            "devices": devices,
            "bubble_threshold_s": a.bubble_threshold,
            "plots": [p.name for p in self.plots],
        }


def _measured_step_time(run: RunData, analysis: Analysis) -> float | None:
    rows = [r for r in run.metrics if isinstance(r.get(STEP_TIME_METRIC), (int, float))]
    if not rows or not analysis.steps:
        return None
    # Iteration markers carry the step number the metrics were logged under; match on it.
    marked = {s.args.get("step") for s in run.step_spans[-len(analysis.steps):]}
    marked.discard(None)
    chosen = [r for r in rows if r.get("step") in marked] if marked else rows
    return sum(r[STEP_TIME_METRIC] for r in chosen) if chosen else None


def build_report(run_dir: str | Path, *, last: int = 3, skip: int = 0, plots: bool = True) -> Report:
    """Analyse ``run_dir``, write ``report.json`` and (unless ``plots=False``) the PNGs beside the trace."""
    run = load_run(run_dir)
    analysis = analyse(run, skip=skip)
    report = Report(run, analysis, _measured_step_time(run, analysis))
    if plots:
        report.plots = write_plots(run, analysis, run.run_dir, last=last)
    (run.run_dir / REPORT_FILE).write_text(json.dumps(report.summary(), indent=1), encoding="utf-8")
    return report


__all__ = ["REPORT_FILE", "Report", "build_report"]
