"""`m2flow demo`: the arithmetic recipe in one process, with progress bars, metrics and a plot.

The run prints its directory first, shows a progress bar with ETA for the warm start and one for
GRPO, writes `warm_start.jsonl` (one row per supervised step) and `metrics.jsonl` (one row per GRPO
step, step 0 being the warm-started model), then `curves.png` (sampled reward and held-out greedy
accuracy per GRPO step) and a final "warm start X% -> after GRPO Y%" line.

It runs the single-process recipe (`arithmetic_demo.run_local_grpo`'s loop), not the Ray runner:
on a 2-core machine the recipe's 100 GRPO steps take a few minutes while the same steps through
Ray workers cost more in start-up and hand-offs than the tiny model costs to train.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from m2flow.config.schema import option
from m2flow.metrics import ConsoleSink, JsonlSink, MetricsLogger
from m2flow.workflows.recipes.arithmetic_demo import (
    ArithmeticDemoRecipe,
    evaluate,
    heldout_problems,
    train_grpo,
    warm_start,
)

log = logging.getLogger(__name__)

WARM_START_FILE = "warm_start.jsonl"
PLOT_FILE = "curves.png"


@dataclass
class ArithmeticDemoConfig(ArithmeticDemoRecipe):
    """The arithmetic demo: a tiny transformer, a warm start on an imperfect teacher, then GRPO."""

    run_dir: str = option("runs/arithmetic_demo", "where the log, metrics and plot are written")
    console: bool = option(True, "show progress bars and the summary on the terminal")

    def validate(self) -> None:
        """Check the recipe settings and the run directory."""
        super().validate()
        if not self.run_dir:
            raise ValueError("run_dir must not be empty")


@dataclass
class DemoOutcome:
    """What `run_arithmetic_demo` reached and where it wrote it."""

    warm_start_accuracy: float
    final_accuracy: float
    run_dir: Path
    plot: Path
    seconds: float


def _recipe_of(cfg: ArithmeticDemoConfig) -> ArithmeticDemoRecipe:
    fields = {k: getattr(cfg, k) for k in ArithmeticDemoRecipe.__dataclass_fields__}
    return ArithmeticDemoRecipe(**fields)


class _StickyConsole(ConsoleSink):
    """A progress bar that keeps showing each key metric's latest value on steps that lack it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latest: dict[str, float | int] = {}

    def write(self, step: int, metrics: Any) -> None:
        self.latest.update(metrics)
        super().write(step, self.latest)


def _logger(run_dir: Path, cfg: ArithmeticDemoConfig, filename: str, total: int, title: str,
            keys: list[str]) -> MetricsLogger:
    sinks: list[Any] = [JsonlSink(run_dir, filename=filename)]
    if cfg.console:
        sinks.append(_StickyConsole(total, title, key_metrics=keys))
    return MetricsLogger(run_dir, is_main=True, sinks=sinks)


def plot_curves(history: list[dict[str, float]], warm_accuracy: float, path: Path) -> Path:
    """Write a PNG of sampled reward per GRPO step and held-out greedy accuracy per evaluation."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    steps = [0] + [int(r["step"]) for r in history]
    rewards = [float("nan")] + [r["reward"] for r in history]
    evals = [(0, warm_accuracy)] + [(int(r["step"]), r["heldout_accuracy"]) for r in history if "heldout_accuracy" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, rewards, color="#1f77b4", alpha=0.7, label="reward (sampled, training prompts)")
    ax.plot([s for s, _ in evals], [a for _, a in evals], "o-", color="#d62728", label="accuracy (greedy, held-out)")
    ax.axhline(warm_accuracy, color="#7f7f7f", linestyle="--", linewidth=1, label="warm start (held-out)")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1)
    ax.set_title("arithmetic demo: GRPO after a warm start on an imperfect teacher")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def run_arithmetic_demo(cfg: ArithmeticDemoConfig) -> DemoOutcome:
    """Warm start, then GRPO, with progress, metrics files and the plot in `cfg.run_dir`."""
    from m2flow.runtime.logs import setup_logging

    cfg.validate()
    start = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", WARM_START_FILE):  # a fresh run: no lines from an earlier one
        (run_dir / name).unlink(missing_ok=True)
    setup_logging(log_file=run_dir / "demo.log", console=False)
    _quiet_transformers()
    recipe = _recipe_of(cfg)
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    say = _printer(cfg)
    say(f"arithmetic demo, seed {recipe.seed}: run directory {run_dir.resolve()}")
    say(f"task: {recipe.digits}-digit {' '.join(recipe.operators)}, answers least significant digit first "
        f"(e.g. '{recipe.task().sample('train', 1, seed=3)[0]['prompt']}' -> "
        f"'{recipe.task().sample('train', 1, seed=3)[0]['answer']}'); the teacher forgets carries and "
        f"borrows in {recipe.slip_rate:.0%} of its demonstrations")

    heldout = heldout_problems(recipe)
    with _logger(run_dir, cfg, WARM_START_FILE, recipe.sft_steps, "warm start", ["actor/sft_loss"]) as metrics:
        warm = warm_start(recipe, on_step=lambda step, loss: metrics.log({"actor/sft_loss": loss}, step))
    warm_acc = evaluate(warm.model, warm.tokenizer, heldout, recipe.max_new_tokens)
    log.info("warm start: %d steps in %.1f s, held-out accuracy %.3f", warm.steps, warm.seconds, warm_acc)
    say(f"warm start: {warm.steps} steps in {warm.seconds:.0f} s, held-out greedy accuracy {warm_acc:.1%}")

    keys = ["rollout/reward", "eval/accuracy"]
    with _logger(run_dir, cfg, "metrics.jsonl", recipe.grpo_steps, "GRPO", keys) as metrics:
        metrics.sinks[0].write(0, {"eval/accuracy": warm_acc})  # the JSONL only: step 0 is no progress

        def on_step(row: dict[str, float]) -> None:
            held = {"eval/accuracy": row["heldout_accuracy"]} if "heldout_accuracy" in row else {}
            metrics.log({"rollout/reward": row["reward"], "rollout/accuracy": row["accuracy"],
                         "rollout/mixed_groups": row["mixed_groups"], "actor/loss": row["loss"],
                         "time/step": row["seconds"], **held}, int(row["step"]))

        history = train_grpo(warm.model, warm.tokenizer, recipe, heldout, on_step=on_step)
    final_acc = history[-1]["heldout_accuracy"]
    plot = plot_curves(history, warm_acc, run_dir / PLOT_FILE)
    seconds = time.perf_counter() - start
    log.info("after GRPO: held-out accuracy %.3f (warm start %.3f); %.0f s in all", final_acc, warm_acc, seconds)
    say(f"plot of reward and held-out accuracy per step: {plot.resolve()}")
    say(f"metrics: {(run_dir / 'metrics.jsonl').resolve()}")
    say(f"warm start {warm_acc:.1%} -> after GRPO {final_acc:.1%} "
        f"(held-out greedy accuracy on {len(heldout)} problems; {seconds:.0f} s in all)")
    return DemoOutcome(warm_acc, final_acc, run_dir, plot, seconds)


def _printer(cfg: ArithmeticDemoConfig) -> Any:
    if not cfg.console:
        return lambda text: None
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)  # paths stay whole, on one line
    return console.print


def _quiet_transformers() -> None:
    """Silence transformers' per-call generation notices, which would tear the progress bar."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a dependency of the recipe anyway
        pass


def run_demo(overrides: list[str]) -> int:
    """Entry point of ``m2flow demo [key=value ...]``; returns a process exit code."""
    from m2flow.config.loader import load_config

    cfg = load_config(ArithmeticDemoConfig, None, overrides)
    run_arithmetic_demo(cfg)
    return 0
