"""V1 learning plot: success vs env steps of RL runs evaluated by ``v1_rl.py``, one line per result file.

    python benchmarks/v1_plot.py benchmarks/results/v1_grpo_reach_seed{0,1,2}.json --out docs/images/v1_grpo_reach.png

Each file gives one line of held-out success (the warm start at 0 env steps, then each evaluated
checkpoint) and, faintly, the training episodes' success rate of the run (``env/success_rate``,
sampled actions, averaged over a window of iterations). Needs matplotlib (the ``viz`` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _smooth(xs: list[float], ys: list[float], window: int) -> tuple[list[float], list[float]]:
    """Means of ``window`` consecutive points."""
    out_x, out_y = [], []
    for i in range(0, len(ys) - window + 1, window):
        out_x.append(xs[i + window - 1])
        out_y.append(sum(ys[i : i + window]) / window)
    return out_x, out_y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="v1_rl.py result files")
    parser.add_argument("--out", type=Path, default=Path("docs/images/v1_learning.png"))
    parser.add_argument("--window", type=int, default=10, help="iterations per point of the training curve")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    top = 0.0
    for k, path in enumerate(args.results):
        try:
            r = json.loads(path.read_text())
            (task,) = r["tasks"]
            held = [(0, r["warm_start"]["success"][task])] + [(c["env_steps"], c["success"][task]) for c in r["checkpoints"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{path}: not a single-task v1_rl.py result with a warm start ({e})") from None
        color = f"C{k}"
        curve = [c for c in r["run"]["curve"] if "env/success_rate" in c]
        x, y = _smooth([c["env/total_steps"] for c in curve], [c["env/success_rate"] for c in curve], args.window)
        ax.plot(x, y, color=color, alpha=0.3, linewidth=1)
        ax.plot(*zip(*held), color=color, marker="o", label=f"seed {r['seed']}: held-out")
        top = max(top, *y, *(h[1] for h in held))
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, min(1.0, top * 1.3 + 0.05))
    ax.set_title("held-out success (50 seeds, greedy; markers) and training success (sampled; faint)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"v1 plot: {len(args.results)} run(s) -> {args.out}")


if __name__ == "__main__":
    main()
