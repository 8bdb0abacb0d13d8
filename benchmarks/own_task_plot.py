"""Held-out success against env steps of VLA runs evaluated by ``own_task_learning.py`` at several checkpoints.

    for c in 5 10 15 20 last; do
        python benchmarks/own_task_learning.py vla --config CONFIG --tag TAG --seeds 0,1,2 --checkpoint $c ... ; done
    python benchmarks/own_task_plot.py --tags ppo_h16_c4g2,ppo_h64_c1 --seeds 0,1,2 \
        --out docs/images/own_task_h16.png --result benchmarks/results/own_task_curve_h16.json

Reads each run directory ``RUN_ROOT/TAG_sSEED``: the successes ``own_task_learning.py`` measured and kept there
(``own_task_success.json``: the warm start, at 0 env steps, and every checkpoint evaluated, greedy and sampled,
on the same held-out seeds) and the run's env steps per iteration (``metrics.jsonl``). One panel per way of
choosing action tokens; per tag the mean over seeds (thick, at the checkpoints every seed has) and each seed
(faint). Writes the numbers as JSON too. Needs matplotlib (the ``viz`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

MODES = ("greedy", "sampled")


def run_curve(run_dir: Path) -> dict[str, dict[int, float]]:
    """``{mode: {env steps: success}}`` of one run, from what was evaluated."""
    cached = json.loads((run_dir / "own_task_success.json").read_text())["success"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    for key, value in cached.items():
        name, mode = key.split("/")
        if name == "warm_start":
            steps = 0
        else:  # step_000010: the checkpoint before iteration 10, after iterations 1-10
            iteration = int(name.split("_")[-1])
            steps = int(rows[iteration - 1]["env/total_steps"])
        curve[mode][steps] = value
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-root", type=Path, default=Path("runs/own_task"))
    parser.add_argument("--tags", required=True, help="comma-separated run tags (one line each)")
    parser.add_argument("--labels", default="", help="legend labels separated by semicolons (default: the tags)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", type=Path, required=True, help="the image")
    parser.add_argument("--result", type=Path, default=None, help="the numbers as JSON")
    args = parser.parse_args()
    tags = [t for t in args.tags.split(",") if t]
    labels = [lab.strip() for lab in args.labels.split(";") if lab.strip()] or tags
    if len(labels) != len(tags):
        raise SystemExit(f"--labels: {len(labels)} labels for {len(tags)} tags")
    seeds = [int(s) for s in args.seeds.split(",")]
    missing = [str(args.run_root / f"{t}_s{s}") for t in tags for s in seeds
               if not (args.run_root / f"{t}_s{s}" / "own_task_success.json").is_file()]
    if missing:
        raise SystemExit(f"not evaluated (run own_task_learning.py first): {', '.join(missing)}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, dict] = {}
    fig, axes = plt.subplots(1, len(MODES), figsize=(10, 3.8), sharey=True)
    for (tag, label), color in zip(zip(tags, labels), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        curves = {s: run_curve(args.run_root / f"{tag}_s{s}") for s in seeds}
        out[tag] = {"label": label, "seeds": {s: {m: sorted(c[m].items()) for m in MODES} for s, c in curves.items()}}
        for ax, mode in zip(axes, MODES):
            for c in curves.values():
                xs = sorted(c[mode])
                ax.plot(xs, [c[mode][x] for x in xs], color=color, alpha=0.25, linewidth=1)
            common = sorted(set.intersection(*(set(c[mode]) for c in curves.values())))
            mean = [statistics.fmean(c[mode][x] for c in curves.values()) for x in common]
            out[tag].setdefault("mean", {})[mode] = list(zip(common, mean))
            ax.plot(common, mean, color=color, linewidth=2.2, marker="o", label=f"{label} (mean of {len(seeds)})")
    for ax, mode in zip(axes, MODES):
        ax.set_title(f"{args.title} {mode} action tokens".strip())
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out success")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    if args.result is not None:
        args.result.write_text(json.dumps(out, indent=1) + "\n")
    for tag, entry in out.items():
        print(tag, {m: [(x, round(y, 3)) for x, y in entry["mean"][m]] for m in MODES})


if __name__ == "__main__":
    main()
