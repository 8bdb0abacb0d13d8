"""Benchmark G1 (learning): synchronous GRPO vs bounded staleness at equal samples, on the demo task.

The demo's config (``m2flow/workflows/reasoning/demo.yaml``: a tiny Qwen2 warm-started on an
imperfect teacher, then GRPO on 2-digit arithmetic) trained for the same iterations (so the same
prompts and samples) with ``algorithm.max_staleness`` 0 and S, for each seed. Both sides take the
behaviour log-probs from inference (``algorithm.old_logprobs: inference``, which staleness needs)
and run on the same disaggregated placement, so the staleness is the only difference. The warm
start is trained once per seed and loaded by both sides. Each run is a fresh process; the sides
alternate (seed 0: sync, S; seed 1: ...). Prints the reward curve (``reward/mean`` per iteration,
in blocks of ten) and held-out accuracy of every run.

    python benchmarks/g1_staleness_learning.py --seeds 0 --staleness 1 --steps 60

Writes ``benchmarks/results/g1_staleness_learning.json`` (or ``--out``) and prints one summary line.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEMO = ROOT / "m2flow" / "workflows" / "reasoning/demo.yaml"


def _overrides(seed: int, steps: int, placement: str, run_dir: str) -> list[str]:
    return [f"seed={seed}", f"steps={steps}", f"run_dir={run_dir}", f"placement={placement}",
            "cluster.cpu_devices_per_node=2", "algorithm.old_logprobs=inference", "metrics.sinks=[jsonl]",
            "actor.num_threads=1", "model.warm_start.threads=1"]


def warm_start(seed: int, steps: int, placement: str, root: Path) -> Path:
    """The demo's warm-started model of ``seed``, trained here once (reused when already there)."""
    from m2flow.workflows.reasoning.data import prepare_model
    from m2flow.driver.registry import load_workflow_config
    from m2flow.workflows.reasoning.warm_start import warm_start_model

    _, cfg = load_workflow_config(DEMO, _overrides(seed, steps, placement, str(root / f"warm_{seed}")))
    return warm_start_model(cfg, prepare_model(cfg.model, cfg.data))


def run_one(staleness: int, seed: int, steps: int, placement: str, model: str) -> dict:
    """One GRPO run in this process from the warm-started ``model``; its curves and loop time."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING
    from m2flow.driver.registry import load_workflow_config

    setup_logging(console=False)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="g1s-") as tmp:
        overrides = _overrides(seed, steps, placement, tmp) + [
            f"model.path={model}", "model.warm_start.steps=0", f"algorithm.max_staleness={staleness}"]
        _, cfg = load_workflow_config(DEMO, overrides)
        start = time.perf_counter()
        result = train(REASONING, cfg)
        seconds = time.perf_counter() - start
    h = result.history
    return {"staleness": staleness, "seed": seed, "iterations": len(h),
            "samples": sum(x["rollout/responses_count"] for x in h),
            "reward": [round(x["reward/mean"], 4) for x in h],
            "eval_accuracy": {i: x["eval/accuracy"] for i, x in enumerate(h) if "eval/accuracy" in x},
            "staleness_mean": statistics.mean(x.get("async/staleness_mean", 0.0) for x in h),
            "dropped": sum(x.get("async/dropped_samples", 0.0) for x in h),
            "run_s": round(seconds, 1), "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def _blocks(curve: list[float], size: int = 10) -> list[float]:
    return [round(statistics.mean(curve[i:i + size]), 3) for i in range(0, len(curve), size)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="GRPO iterations per run (the demo's 60)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--staleness", type=int, default=1, help="the asynchronous side's algorithm.max_staleness")
    p.add_argument("--placement", default="rollout,reward: 0, inference,actor: 1")
    p.add_argument("--out", default=str(HERE / "results" / "g1_staleness_learning.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "staleness,seed,model": one run here
    args = p.parse_args()
    if args.one:
        staleness, seed, model = args.one.split(",", 2)
        print(json.dumps(run_one(int(staleness), int(seed), args.steps, args.placement, model)))
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    runs = []
    with tempfile.TemporaryDirectory(prefix="g1s-warm-") as root:
        for seed in (int(x) for x in args.seeds.split(",")):
            model = warm_start(seed, args.steps, args.placement, Path(root))
            for staleness in (0, args.staleness):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--one", f"{staleness},{seed},{model}",
                       "--steps", str(args.steps), "--placement", args.placement]
                with tempfile.TemporaryDirectory(prefix="g1s-cwd-") as cwd:
                    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode != 0 or not lines:
                    raise RuntimeError(f"run {staleness},{seed} failed:\n{proc.stderr[-3000:]}")
                runs.append(json.loads(lines[-1]))
                r = runs[-1]
                print(f"seed {seed} staleness {staleness}: reward by 10 iterations {_blocks(r['reward'])}, "
                      f"held-out accuracy {r['eval_accuracy']}, {r['run_s']} s (load {r['load']})", file=sys.stderr)
    summary = {}
    for s in (0, args.staleness):
        side = [r for r in runs if r["staleness"] == s]
        summary[f"staleness_{s}"] = {
            "reward_last10": round(statistics.mean(statistics.mean(r["reward"][-10:]) for r in side), 3),
            "eval_accuracy_end": round(statistics.mean(list(r["eval_accuracy"].values())[-1] for r in side), 3),
            "run_s": round(statistics.mean(r["run_s"] for r in side), 1)}
    record = {"benchmark": "G1-staleness-learning", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "placement": args.placement, "summary": summary, "runs": runs,
              "load_max": max(x for r in runs for x in r["load"])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"G1 staleness learning (load up to {record['load_max']}) | "
          + " | ".join(f"{k}: {v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
