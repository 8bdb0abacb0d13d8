"""The report on the terminal: rich tables of the component breakdown and device usage."""

from __future__ import annotations

from typing import Any

from m2flow.report.analysis import IDLE
from m2flow.report.report import Report


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def render(report: Report, console: Any = None) -> None:
    """Print the report's tables to ``console`` (a new rich console on stdout by default)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = report.summary()
    if s["iterations"]:
        t = Table(title="Time per component",
                  caption=f"{s['iterations']} iteration(s), {_ms(s['iteration_time_s'])} ms")
        t.add_column("component")
        t.add_column("wall ms", justify="right")
        t.add_column("share", justify="right")
        t.add_column("busy rank-ms", justify="right")
        for c in s["components"]:
            style = "dim" if c["name"] == IDLE else None
            t.add_row(c["name"], _ms(c["wall_s"]), f"{c['share']:.1%}",
                      _ms(c["busy_s"]) if c["name"] != IDLE else "", style=style)
        parts = sum(c["wall_s"] for c in s["components"])
        t.add_section()
        t.add_row("sum", _ms(parts), f"{parts / s['iteration_time_s']:.1%}" if s["iteration_time_s"] else "")
        console.print(t)
        measured = s["measured_step_time_s"]
        if measured:
            console.print(f"components sum to {_ms(parts)} ms; the runner measured {_ms(measured)} ms "
                          f"(time/step): {parts / measured:.1%}")
    if s["devices"]:
        d = Table(title=f"Devices (bubbles: idle gaps >= {_ms(s['bubble_threshold_s'])} ms)")
        for col, just in (("device", "left"), ("workers", "left"), ("busy", "right"),
                          ("idle", "right"), ("bubbles", "right"), ("bubble ms", "right"),
                          ("longest ms", "right")):
            d.add_column(col, justify=just)
        for row in s["devices"]:
            d.add_row(row["device"], ", ".join(row["processes"]), f"{row['busy_fraction']:.1%}",
                      f"{1 - row['busy_fraction']:.1%}", str(row["bubbles"]), _ms(row["bubble_s"]),
                      _ms(row["longest_bubble_s"]))
        console.print(d)
    if s["iterations"] > 1:
        durs = [x["duration_s"] for x in s["steps"]]
        console.print(f"iterations: first {_ms(durs[0])} ms, last {_ms(durs[-1])} ms, "
                      f"mean {_ms(sum(durs) / len(durs))} ms")
    if report.run.metrics:
        last = report.run.metrics[-1]
        shown = {k: v for k, v in last.items() if k not in ("time",)}
        console.print("last metrics: " + "  ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))
    if report.plots:
        console.print("plots: " + ", ".join(str(p) for p in report.plots))
