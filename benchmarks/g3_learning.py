"""Benchmark G3 (learning): GRPO with and without partial rollouts at equal samples, on a long-tail task.

The running-sums example (``examples/reasoning/running_sums_grpo.yaml``: a tiny Qwen2 warm-started on
an imperfect teacher, then GRPO; answers of 1..24 reasoning steps, most short) trained for the same
iterations from the same warm start on two sides, per seed:

- ``sync``: the synchronous plan, ``algorithm.max_staleness: 0``, every group of an iteration waited for;
- ``partial``: ``rollout.partial: true`` with ``max_staleness: 1`` (which it needs): an iteration trains on
  the groups that finish first, the rest go on in the next iteration (one spanning more than two
  iterations starts over);
- ``partial_s2`` (with ``--sides``): the same with ``max_staleness: 2``, where a response may span three
  iterations and the rollout also generates one iteration ahead.

Both take the behaviour log-probs from the rollout (``old_logprobs: rollout``, which partial rollouts
need) and run ``placement: local`` with one torch thread. Equal samples is checked, not assumed: the
actor's accepted groups are recorded in process, and each run reports the responses and response tokens
it trained on (a group passed over as too old is not counted), and the lengths of the responses of each
iteration (max / min, p10 / median / p90; the share of 13+ tokens). The warm start is trained once per seed and loaded by both
sides; each run is a fresh process.

    python benchmarks/g3_learning.py --seeds 0,1,2 --steps 30 --sides sync,partial,partial_s2

Writes ``benchmarks/results/g3_learning.json`` (or ``--out``) and prints a table.
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

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = ROOT / "examples" / "reasoning" / "running_sums_grpo.yaml"
SIDES = {"sync": ["rollout.partial=false", "algorithm.max_staleness=0"],
         "partial": ["rollout.partial=true", "algorithm.max_staleness=1"],
         "partial_s2": ["rollout.partial=true", "algorithm.max_staleness=2"]}


LONG = 13
"""Responses of at least this many tokens (12+ reasoning steps) count as the tail in ``long_share``."""


def _overrides(seed: int, steps: int, run_dir: str) -> list[str]:
    return [f"seed={seed}", f"steps={steps}", f"run_dir={run_dir}", "metrics.sinks=[jsonl]",
            "actor.num_threads=1", "model.warm_start.threads=1"]


def warm_start(seed: int, steps: int, root: Path) -> tuple[Path, float]:
    """The example's warm-started model of ``seed`` and the seconds it took (base model included)."""
    from m2flow.driver.registry import load_workflow_config
    from m2flow.workflows.reasoning.data import prepare_model
    from m2flow.workflows.reasoning.warm_start import warm_start_model

    _, cfg = load_workflow_config(CONFIG, _overrides(seed, steps, str(root / f"warm_{seed}")))
    start = time.perf_counter()
    path = warm_start_model(cfg, prepare_model(cfg.model, cfg.data))
    return path, time.perf_counter() - start


def _record_trained(seen: list[tuple[int, list[int]]]) -> None:
    """Patch the actor (in this process: ``placement: local``) to append (iteration, response lengths) of
    every group it takes and trains on."""
    from m2flow.workers.actor import ActorWorker

    accept = ActorWorker._accept

    def recording(self, step, groups):
        out = accept(self, step, groups)
        for g in out:
            if not g.dropped:
                seen.append((step, [int(x) for x in g.batch.response_mask.sum(dim=1).tolist()]))
        return out

    ActorWorker._accept = recording


def _spread(lengths: list[int]) -> dict[str, float]:
    a = np.asarray(lengths, dtype=float)
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return {"min": a.min(), "p10": p10, "median": p50, "p90": p90, "max": a.max(), "max_over_min": a.max() / a.min()}


def run_one(side: str, seed: int, steps: int, model: str) -> dict:
    """One GRPO run of ``side`` in this process from the warm-started ``model``."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.autoplan.entry import train
    from m2flow.driver.registry import load_workflow_config
    from m2flow.runtime.logs import setup_logging
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING

    setup_logging(console=False)
    seen: list[tuple[int, list[int]]] = []
    _record_trained(seen)
    with tempfile.TemporaryDirectory(prefix="g3l-") as tmp:
        overrides = _overrides(seed, steps, tmp) + [f"model.path={model}", "model.warm_start.steps=0", *SIDES[side]]
        _, cfg = load_workflow_config(CONFIG, overrides)
        start = time.perf_counter()
        result = train(REASONING, cfg)
        seconds = time.perf_counter() - start
    h = result.history
    per_iter: dict[int, list[int]] = {}
    for step, lengths in seen:
        per_iter.setdefault(step, []).extend(lengths)
    spreads = [_spread(v) for _, v in sorted(per_iter.items())]
    trained = [n for _, v in sorted(per_iter.items()) for n in v]
    cumulative = np.cumsum([sum(v) for _, v in sorted(per_iter.items())])  # tokens trained after each iteration
    return {"side": side, "seed": seed, "iterations": len(h),
            "trained_responses": sum(len(v) for v in per_iter.values()),
            "trained_tokens": sum(sum(v) for v in per_iter.values()),
            "generated_responses": sum(x["rollout/responses_count"] for x in h),
            "resumed_groups": sum(x.get("rollout/partial_resumed_count", 0.0) for x in h),
            "restarted_groups": sum(x.get("rollout/partial_restarted_count", 0.0) for x in h),
            "carried_at_end": h[-1].get("rollout/partial_carried_count", 0.0),
            "reward": [round(x["reward/mean"], 4) for x in h],
            "eval_accuracy": {step: m["eval/accuracy"] for step, m in result.evaluations},
            "spread": {k: round(statistics.median(s[k] for s in spreads), 2) for k in spreads[0]},
            "iterations_10x": sum(s["max_over_min"] >= 10 for s in spreads) / len(spreads),
            "long_share": round(sum(n >= LONG for n in trained) / len(trained), 4),
            "tokens_at_eval": {step: int(cumulative[step - 1]) if step else 0 for step, _ in result.evaluations},
            "run_s": round(seconds, 1)}


def _one_process(side: str, seed: int, steps: int, model: Path, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", f"{side},{seed},{model}", "--steps", str(steps)]
    with tempfile.TemporaryDirectory(prefix="g3l-cwd-") as cwd:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"run {side},{seed} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="GRPO iterations per run (the example's 30)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--sides", default="sync,partial", help=f"sides to run, of {list(SIDES)}")
    p.add_argument("--out", default=str(HERE / "results" / "g3_learning.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "side,seed,model": one run here
    args = p.parse_args()
    if args.one:
        side, seed, model = args.one.split(",", 2)
        print(json.dumps(run_one(side, int(seed), args.steps, model)))
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    sides = args.sides.split(",")
    unknown = [x for x in sides if x not in SIDES]
    if unknown:
        p.error(f"unknown side(s) {unknown}; valid: {list(SIDES)}")
    runs, warm = [], {}
    with tempfile.TemporaryDirectory(prefix="g3l-warm-") as root:
        for seed in (int(x) for x in args.seeds.split(",")):
            model, warm[seed] = warm_start(seed, args.steps, Path(root))
            for side in sides:
                runs.append(_one_process(side, seed, args.steps, model, env))
                r = runs[-1]
                acc = _curve(r)
                print(f"seed {seed} {side}: held-out {acc[0]:.3f} -> {acc[-1]:.3f} (curve {acc}), trained "
                      f"{r['trained_responses']} responses / {r['trained_tokens']} tokens, lengths {r['spread']}, "
                      f"{r['run_s']} s", file=sys.stderr)
    for r in runs:  # the other view of equal samples: the sync run of the seed at this run's trained tokens
        sync = next((x for x in runs if x["seed"] == r["seed"] and x["side"] == "sync"), None)
        if sync is not None:
            r["sync_at_equal_tokens"] = round(_at_tokens(sync, r["trained_tokens"]), 4)
    summary = {}
    for side in sides:
        mine = [r for r in runs if r["side"] == side]
        summary[side] = {"warm_start": _mean(_curve(r)[0] for r in mine), "end": _mean(_curve(r)[-1] for r in mine),
                         "curve_mean": _mean(statistics.mean(_curve(r)[1:]) for r in mine),
                         "trained_responses": statistics.mean(r["trained_responses"] for r in mine),
                         "trained_tokens": statistics.mean(r["trained_tokens"] for r in mine),
                         "long_share": _mean(r["long_share"] for r in mine)}
        if all("sync_at_equal_tokens" in r for r in mine):
            summary[side]["sync_at_equal_tokens"] = _mean(r["sync_at_equal_tokens"] for r in mine)
    record = {"benchmark": "G3-learning", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "warm_start_s": {s: round(t, 1) for s, t in warm.items()}, "summary": summary, "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    steps = list(runs[0]["eval_accuracy"])
    print(f"held-out accuracy after iterations {steps} (the first: the warm start)")
    print("| seed | side | held-out curve | end | mean past the warm start | sync at the same trained tokens | "
          f"trained responses | trained tokens | share of {LONG}+ tokens |")
    for r in runs:
        c = _curve(r)
        print(f"| {r['seed']} | {r['side']} | {' / '.join(f'{x:.3f}' for x in c)} | {c[-1]:.3f} | "
              f"{statistics.mean(c[1:]):.3f} | {r.get('sync_at_equal_tokens', float('nan')):.3f} | "
              f"{r['trained_responses']} | {r['trained_tokens']} | {r['long_share']:.3f} |")
    for side, v in summary.items():
        print(f"| mean | {side} | warm start {v['warm_start']:.3f} | {v['end']:.3f} | {v['curve_mean']:.3f} | "
              f"{v.get('sync_at_equal_tokens', float('nan')):.3f} | {v['trained_responses']:.0f} | "
              f"{v['trained_tokens']:.0f} | {v['long_share']:.3f} |")


def _curve(run: dict) -> list[float]:
    """A run's held-out accuracies in the order evaluated (the warm start first)."""
    return list(run["eval_accuracy"].values())


def _at_tokens(run: dict, tokens: float) -> float:
    """A run's held-out accuracy after ``tokens`` trained response tokens, linear between its evaluations (its
    last one beyond them)."""
    xs = [run["tokens_at_eval"][k] for k in run["eval_accuracy"]]
    return float(np.interp(tokens, xs, _curve(run)))


def _mean(xs) -> float:
    return round(statistics.mean(xs), 4)


if __name__ == "__main__":
    main()
