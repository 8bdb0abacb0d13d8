"""Agentic learning figures: held-out success before and after RL, per seed, from the shipped examples.

For each seed, in a fresh process each:

- ``calculator`` (``examples/agentic/calculator_grpo.yaml``): the warm start on the imperfect teacher, then
  the example's GRPO iterations with the calculator tool. Held-out accuracy on the example's 200
  ``test``-split problems: the warm start without the tool (greedy), the warm start with the tool (greedy
  and sampled at temperature 1), and after every ``eval_every`` GRPO iterations (sampled).
- ``guess_number`` (``examples/agentic/guess_number_grpo.yaml``): the untrained model, the warm start on the
  imperfect guessing teacher, then GRPO. Win rate, mean turns and mean return of the example's held-out
  episodes (sampled at temperature 1), before and after RL.

Each seed sets ``seed``, the tiny model's initialisation (``model.tiny.seed``) and its own model directory.

    python benchmarks/agentic_learning.py --task calculator --seeds 0,1,2

Writes ``benchmarks/results/agentic_<task>_seeds.json`` (or ``--out``) and prints one summary line.
Learning figures, not timings: the load average is recorded only to explain wall-clock times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = {"calculator": ROOT / "examples" / "agentic" / "calculator_grpo.yaml",
            "guess_number": ROOT / "examples" / "agentic" / "guess_number_grpo.yaml"}
KEYS = ("eval/success", "eval/turns_mean", "eval/return_mean", "eval/tool_calls")


def _eval(example: Path, overrides: list[str]) -> dict[str, float]:
    """The held-out evaluation before any training of a one-iteration run of ``example`` with ``overrides``."""
    from m2flow.driver.registry import load_workflow_config
    from m2flow.autoplan.entry import train
    from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC

    _, cfg = load_workflow_config(example, [*overrides, "steps=1", "eval_every=1", "model.warm_start.steps=0",
                                            "model.create_tiny=false"])
    step, metrics = train(AGENTIC, cfg).evaluations[0]
    assert step == 0, step
    return {k: metrics[k] for k in KEYS if k in metrics}


def run_seed(task: str, seed: int, steps: int | None, work: Path, extra: list[str]) -> dict[str, Any]:
    """Every figure of one seed (runs in this process)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import torch

    torch.set_num_threads(1)
    from m2flow.driver.registry import load_workflow_config
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.entry import train
    from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC

    setup_logging(console=False)
    example = EXAMPLES[task]
    base = ["placement=local", "metrics.sinks=[jsonl]", "model.warm_start.threads=1", "actor.num_threads=1", *extra]
    model = work / f"model-{seed}"
    rl_dir = work / f"rl-{seed}"
    out: dict[str, Any] = {"seed": seed, "load_before": round(os.getloadavg()[0], 2)}
    start = time.perf_counter()
    if task == "guess_number":
        # The untrained model (the tiny model built at model.path), before any warm start.
        from m2flow.workflows.agentic.warm_start import prepare_model

        _, cfg = load_workflow_config(example, [*base, f"seed={seed}", f"model.path={model}", f"model.tiny.seed={seed}"])
        prepare_model(cfg.model)
        out["untrained"] = _eval(example, [*base, f"seed={seed}", f"model.path={model}",
                                           f"run_dir={work / f'untrained-{seed}'}"])
    overrides = [*base, f"seed={seed}", f"run_dir={rl_dir}", f"model.path={model}", f"model.tiny.seed={seed}"]
    if steps is not None:
        overrides.append(f"steps={steps}")
    _, cfg = load_workflow_config(example, overrides)
    result = train(AGENTIC, cfg)
    out["rl"] = [{"iteration": it, **{k: m[k] for k in KEYS if k in m}} for it, m in result.evaluations]
    out["rl_seconds"] = round(time.perf_counter() - start, 1)
    warm = rl_dir / "warm_start"
    if cfg.model.warm_start.steps:
        eval_base = [*base, f"seed={seed}", f"model.path={warm}"]
        out["warm_start_greedy"] = _eval(example, [*eval_base, f"run_dir={work / f'greedy-{seed}'}",
                                                   "rollout.eval_temperature=0"])
        if task == "calculator":
            out["warm_start_no_tool_greedy"] = _eval(example, [
                *eval_base, f"run_dir={work / f'notool-{seed}'}", "rollout.eval_temperature=0",
                "env.eval_kwargs={split: test, tools: false}"])
    out["load_after"] = round(os.getloadavg()[0], 2)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage, the mean and range over seeds of every metric."""
    stages: dict[str, list[dict[str, float]]] = {}
    for r in runs:
        for name in ("untrained", "warm_start_no_tool_greedy", "warm_start_greedy"):
            if name in r:
                stages.setdefault(name, []).append(r[name])
        stages.setdefault("warm_start_sampled" if "warm_start_greedy" in r else "before_rl_sampled", []).append(r["rl"][0])
        stages.setdefault("after_rl_sampled", []).append(r["rl"][-1])
    out = {}
    for name, rows in stages.items():
        out[name] = {k: {"mean": round(statistics.mean(row[k] for row in rows), 4),
                         "min": round(min(row[k] for row in rows), 4), "max": round(max(row[k] for row in rows), 4)}
                     for k in KEYS if all(k in row for row in rows)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(EXAMPLES), default="calculator")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=None, help="GRPO iterations (default: the example's)")
    p.add_argument("--out", default=None)
    p.add_argument("--set", action="append", default=[], help="a further config override of every run (key=value)")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # one seed here, JSON out
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(run_seed(args.task, args.one, args.steps, Path(args.work), args.set)))
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    runs = []
    with tempfile.TemporaryDirectory(prefix="agentic-learning-") as work:
        for seed in (int(x) for x in args.seeds.split(",")):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--task", args.task, "--one", str(seed),
                   "--work", work, *([] if args.steps is None else ["--steps", str(args.steps)]),
                   *(f"--set={s}" for s in args.set)]
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"seed {seed} failed:\n{proc.stderr[-3000:]}")
            runs.append(json.loads(lines[-1]))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    summary = summarize(runs)
    record = {"benchmark": f"agentic-learning-{args.task}", "example": str(EXAMPLES[args.task].relative_to(ROOT)),
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "summary": summary, "runs": runs}
    out = Path(args.out or HERE / "results" / f"agentic_{args.task}_seeds.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    before = summary.get("warm_start_sampled") or summary["before_rl_sampled"]
    after = summary["after_rl_sampled"]
    print(f"{args.task}, seeds {args.seeds}: success {before['eval/success']['mean']} -> {after['eval/success']['mean']}, "
          f"turns {before['eval/turns_mean']['mean']} -> {after['eval/turns_mean']['mean']} (sampled, held out)")


if __name__ == "__main__":
    main()
