"""PNG plots of a run (matplotlib, Agg backend): Gantt of the last iterations, breakdown, devices,
throughput and learning curves."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from m2flow.report.analysis import IDLE, Analysis, clip, step_throughput
from m2flow.report.load import RunData
from m2flow.runtime.trace import STEP_CATEGORY, WAIT_CATEGORIES

log = logging.getLogger(__name__)

# Fixed colours for the categories the runtime knows, so every report reads the same way.
_FIXED = {
    "generate": "#1f77b4", "reward": "#ff7f0e", "logprobs": "#2ca02c", "train": "#d62728",
    "env_step": "#9467bd", "weight_sync": "#8c564b", "offload": "#7f7f7f", "onload": "#bcbd22",
    "wait_channel": "#e0e0e0", "wait_lock": "#c8c8c8", STEP_CATEGORY: "#f2f2f2", IDLE: "#ffffff",
}
_SPARE = ["#17becf", "#e377c2", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
          "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79"]
CURVE_PREFIXES_EXCLUDED = ("time/", "perf/")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, safe in worker threads and CI
    import matplotlib.pyplot as plt

    return plt


def colors_for(categories: Sequence[str]) -> dict[str, str]:
    """A colour per category: fixed ones for known categories, spares in order for the rest."""
    out, spare = {}, iter(_SPARE * 4)
    for c in categories:
        out[c] = _FIXED[c] if c in _FIXED else next(spare)
    return out


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_gantt(run: RunData, analysis: Analysis, path: Path, last: int = 3) -> Path:
    """Rows = driver and each ``group[rank]``, bars = innermost spans coloured by category, last steps."""
    plt = _pyplot()
    steps = analysis.steps[-last:] if analysis.steps else []
    if not steps:
        raise ValueError("no iterations to draw")
    t0, t1 = steps[0].start, steps[-1].end
    tracks = run.tracks
    cats = [c for c in analysis.priority if c != STEP_CATEGORY]
    cats += sorted({s.cat for segs in analysis.segments.values() for s in segs} - set(cats) - {STEP_CATEGORY})
    colors = colors_for(cats + [STEP_CATEGORY])
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(tracks)))
    for row, track in enumerate(tracks):
        segs = clip(analysis.segments[(track.pid, track.tid)], t0, t1)
        for cat in {s.cat for s in segs}:
            bars = [((s.start - t0) * 1e3, (s.end - s.start) * 1e3) for s in segs if s.cat == cat]
            hatch = "//" if cat in WAIT_CATEGORIES else None
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colors[cat], edgecolor="none",
                           hatch=hatch)
    for s in steps:
        ax.axvline((s.start - t0) * 1e3, color="black", lw=0.6, ls="--")
        ax.text((s.start - t0) * 1e3, -0.75, f"step {s.index}", fontsize=7, va="bottom")
    ax.axvline((t1 - t0) * 1e3, color="black", lw=0.6, ls="--")
    ax.set_yticks(range(len(tracks)), [t.label for t in tracks])
    ax.set_ylim(len(tracks) - 0.5, -0.9)
    ax.set_xlim(0, (t1 - t0) * 1e3)
    ax.set_xlabel("ms since the start of the first step shown")
    ax.set_title(f"Timeline of the last {len(steps)} iteration(s)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colors[c], edgecolor="grey", lw=0.3,
                             hatch="//" if c in WAIT_CATEGORIES else None)
               for c in cats + [STEP_CATEGORY]]
    ax.legend(handles, cats + [STEP_CATEGORY], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize=8, frameon=False)
    return _save(fig, path)


def plot_breakdown(analysis: Analysis, path: Path) -> Path:
    """Stacked bar per iteration: its measured time split over components and idle."""
    plt = _pyplot()
    cats = list(analysis.totals())
    colors = colors_for(cats)
    fig, ax = plt.subplots(figsize=(10, 4))
    x = [s.index for s in analysis.steps]
    bottom = [0.0] * len(x)
    for c in cats:
        h = [s.parts.get(c, 0.0) * 1e3 for s in analysis.steps]
        ax.bar(x, h, bottom=bottom, color=colors[c], label=c, edgecolor="grey", linewidth=0.3)
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.set_xlabel("iteration")
    ax.set_ylabel("ms")
    ax.set_title("Iteration time by component")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return _save(fig, path)


def plot_devices(analysis: Analysis, path: Path) -> Path:
    """Busy, bubble and other idle fraction of each device."""
    plt = _pyplot()
    devs = analysis.devices
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.4 * max(1, len(devs))))
    labels = [f"{d.label} ({', '.join(d.processes)})" for d in devs]
    busy = [d.busy_fraction * 100 for d in devs]
    bub = [d.bubble_time / d.window * 100 if d.window else 0.0 for d in devs]
    rest = [max(0.0, 100 - b - g) for b, g in zip(busy, bub)]
    ax.barh(labels, busy, color="#2ca02c", label="busy")
    ax.barh(labels, bub, left=busy, color="#d62728", label="bubbles")
    ax.barh(labels, rest, left=[b + g for b, g in zip(busy, bub)], color="#dddddd", label="other idle")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% of the analysed iterations")
    ax.set_title("Device utilisation")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return _save(fig, path)


def _series(rows: list[dict[str, Any]], name: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r.get("step", len(xs)))
            ys.append(v)
    return xs, ys


def _metric_names(rows: list[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in ("step", "time"):
                names.setdefault(k)
    return list(names)


def _grid(plt: Any, n: int, title: str) -> tuple[Any, list[Any]]:
    cols = min(3, max(1, n))
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    fig.suptitle(title)
    return fig, flat[:n]


def plot_throughput(run: RunData, analysis: Analysis, path: Path) -> Path:
    """Iterations per second from the trace, and every ``time/`` and ``perf/`` metric, over time."""
    plt = _pyplot()
    names = [n for n in _metric_names(run.metrics) if n.startswith(CURVE_PREFIXES_EXCLUDED)]
    pts = step_throughput(analysis)
    fig, axes = _grid(plt, bool(pts) + len(names), "Throughput and timings")
    if pts:
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker=".", lw=1)
        axes[0].set_xlabel("s since the first iteration")
        axes[0].set_title("iterations/s (trace)", fontsize=9)
    for ax, name in zip(axes[bool(pts):], names):
        xs, ys = _series(run.metrics, name)
        ax.plot(xs, ys, marker=".", lw=1)
        ax.set_xlabel("step")
        ax.set_title(name, fontsize=9)
    return _save(fig, path)


def plot_learning_curves(run: RunData, path: Path, max_plots: int = 12) -> Path | None:
    """Every metric outside ``time/`` and ``perf/`` against the step (None when there are none)."""
    names = [n for n in _metric_names(run.metrics) if not n.startswith(CURVE_PREFIXES_EXCLUDED)]
    if not names:
        return None
    plt = _pyplot()
    shown = names[:max_plots]
    if len(names) > max_plots:
        log.info("learning curves: showing %d of %d metrics", max_plots, len(names))
    fig, axes = _grid(plt, len(shown), "Learning curves")
    for ax, name in zip(axes, shown):
        xs, ys = _series(run.metrics, name)
        ax.plot(xs, ys, lw=1)
        ax.set_xlabel("step")
        ax.set_title(name, fontsize=9)
    return _save(fig, path)


def write_plots(run: RunData, analysis: Analysis, out_dir: Path, last: int = 3) -> list[Path]:
    """Write every plot the data allows into ``out_dir``; returns the files written."""
    out: list[Path] = []
    if analysis.steps and run.tracks:
        out.append(plot_gantt(run, analysis, out_dir / "gantt.png", last))
        out.append(plot_breakdown(analysis, out_dir / "breakdown.png"))
    if analysis.steps or any(n.startswith(CURVE_PREFIXES_EXCLUDED) for n in _metric_names(run.metrics)):
        out.append(plot_throughput(run, analysis, out_dir / "throughput.png"))
    if analysis.devices:
        out.append(plot_devices(analysis, out_dir / "devices.png"))
    curves = plot_learning_curves(run, out_dir / "learning_curves.png")
    if curves is not None:
        out.append(curves)
    return out

