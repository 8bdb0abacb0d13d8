"""``m2flow demo``: the reasoning workflow on the arithmetic task, told as a story, with a plot.

It loads ``DEMO_CONFIG`` (``reasoning/demo.yaml``, shipped beside this module so an installed
package finds it) with the command line's ``key=value`` overrides, announces the task, prints the
plan the workflow launched, runs the driver's ``Run`` (the same workflow ``m2flow train`` runs: warm
start, then the macro loop), and ends with ``curves.png`` (reward and held-out accuracy per
iteration) and the line ``warm start X% -> after GRPO Y%``. Nothing here trains: the demo is a
config, and what it tells is read from the run's history. Text goes through the ``say`` callback
the command line passes in.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from m2flow.driver.run_config import is_auto
from m2flow.workflows.reasoning.config import ReasoningConfig

if TYPE_CHECKING:  # the workflow (and torch) load only when the demo runs
    from m2flow.planner import Plan

log = logging.getLogger(__name__)

DEMO_CONFIG = Path(__file__).with_name("demo.yaml")
PLOT_FILE = "curves.png"

Say = Callable[[str], None]


@dataclass
class DemoOutcome:
    """What the demo reached and where it wrote it."""

    warm_start_accuracy: float
    final_accuracy: float
    run_dir: Path
    plot: Path
    seconds: float


def load_demo_config(overrides: Sequence[str] = (), path: Path = DEMO_CONFIG) -> ReasoningConfig:
    """The demo's reasoning config with ``key=value`` overrides applied, validated."""
    from m2flow.driver.registry import load_workflow_config

    spec, cfg = load_workflow_config(path, list(overrides))
    if not isinstance(cfg, ReasoningConfig):
        raise ValueError(f"{path} configures workflow {spec.name!r}, not 'reasoning'")
    return cfg


def eval_points(evaluations: Sequence[tuple[int, dict[str, float]]]) -> list[tuple[int, float]]:
    """(updates done, held-out accuracy) of every evaluation of a run (``TrainResult.evaluations``: the
    baseline before training at 0, then one after every ``eval_every``-th update and the last)."""
    key = "eval/accuracy"
    return [(step, m[key]) for step, m in evaluations if key in m]


def plot_curves(history: Sequence[dict[str, float]], evaluations: Sequence[tuple[int, dict[str, float]]],
                path: Path) -> Path:
    """A PNG of the sampled reward per iteration and the greedy held-out accuracy per evaluation."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    evals = eval_points(evaluations)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(range(1, len(history) + 1), [h.get("reward/mean", float("nan")) for h in history],
            color="#1f77b4", alpha=0.7, label="reward (sampled, training prompts)")
    ax.plot([s for s, _ in evals], [a for _, a in evals], "o-", color="#d62728", label="accuracy (greedy, held-out)")
    if evals:
        ax.axhline(evals[0][1], color="#7f7f7f", linestyle="--", linewidth=1, label="warm start (held-out)")
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


def describe_task(cfg: ReasoningConfig) -> str:
    """One line on the task and the teacher, with an example problem."""
    from m2flow.workflows.reasoning.data import arithmetic_task

    a = cfg.data.arithmetic
    example = arithmetic_task(cfg.data).sample("train", 1, seed=3)[0]
    order = "least significant digit first" if a.reverse_answer else "most significant digit first"
    line = (f"task: {a.digits}-digit {' '.join(a.operators)}, answers {order} "
            f"(e.g. '{example['prompt']}' -> '{example['answer']}')")
    ws = cfg.model.warm_start
    if ws.steps and ws.source == "teacher":
        line += f"; the teacher forgets carries and borrows in {a.teacher_slip_rate:.0%} of its demonstrations"
    return line


def print_plan(plan: Plan, say: Say) -> None:
    """Show the plan the workflow applies (devices, fusions, edges, settings): the one place the demo prints it."""
    for line in plan.table().splitlines():
        say(line)


def run_demo(overrides: Sequence[str] = (), say: Say = lambda text: None) -> DemoOutcome:
    """Load the demo config, run the reasoning workflow on it, plot, and tell the outcome through ``say``."""
    from m2flow.driver.run import Run
    from m2flow.workflows.reasoning.workflow import WORKFLOW

    cfg = load_demo_config(overrides)
    # transformers' notices and weight-loading bars would tear the progress bars; the workers
    # inherit these from the driver's environment.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    start = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    say(f"arithmetic demo, seed {cfg.seed}: run directory {run_dir.resolve()}")
    if cfg.data.kind == "arithmetic":
        say(describe_task(cfg))
    if is_auto(cfg.placement):  # the planner chooses: profile (or reuse RUN_DIR/profile.json), search, say why
        from m2flow.autoplan.auto import resolve

        say("placement auto: profiling and searching the plans (the profile is reused on the next run)")
        choice = resolve(WORKFLOW, cfg)
        for line in choice.describe():
            say(line)
        plan = choice.plan  # the plan the search built runs as it is
    else:
        plan = None
    with Run(WORKFLOW, cfg, plan=plan) as run:  # builds the model and runs the warm start first
        assert run.plan is not None
        print_plan(run.plan, say)
        result = run.train()
    evals = eval_points(result.evaluations)
    if not evals:
        raise ValueError("the demo needs held-out evaluations (eval_every > 0 and a held-out split)")
    warm, final = evals[0][1], evals[-1][1]
    plot = plot_curves(result.history, result.evaluations, run_dir / PLOT_FILE)
    seconds = time.perf_counter() - start
    log.info("demo: held-out accuracy %.3f -> %.3f in %.0f s", warm, final, seconds)
    count = cfg.eval_size or cfg.data.arithmetic.test_size
    say(f"plot of reward and held-out accuracy per step: {plot.resolve()}")
    say(f"metrics: {(run_dir / 'metrics.jsonl').resolve()}")
    say(f"warm start {warm:.1%} -> after GRPO {final:.1%} "
        f"(held-out greedy accuracy on {count} problems; {seconds:.0f} s in all)")
    return DemoOutcome(warm, final, run_dir, plot, seconds)
