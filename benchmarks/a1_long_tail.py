"""Benchmark A1 with a long-tail tool: the agentic calculator workload with and without partial rollouts.

The workload of A1/A2 (``examples/agentic/calculator_grpo.yaml``: 8 groups x 4 episodes per iteration, up to 3
turns, GRPO) from one model warm-started at the start (``--warm-steps`` supervised steps on the imperfect
teacher, so the model calls the tool; ``--model`` reuses one), with a tool whose latency is heavy-tailed:
``tool_latency_s: {dist: lognormal, median_s: 0.02, sigma: 1.5, max_s: 0.5}`` by default (0-500 ms a call,
half of them under 20 ms, about 2% at the 500 ms cap; seeded by the episode, so both sides see the same
waits for the same episode). Both sides run the same plan, four env workers apart (``env: 1-4, rollout,actor: 0``
by default, ``--placement`` for another) with ``--staleness`` (1) and ``env.concurrent: true`` (a worker's
calls wait side by side); one side adds ``rollout.partial: true``. ``--sides`` picks among four: ``partial`` and
``whole`` (with ``env.async_steps`` as ``--async-steps`` says), ``partial_async`` and ``whole_async`` (with it on:
a turn round takes the tool answers that have come and plays on, ``m2flow/envs/text/batch.py``).

Sides alternate, each round starting with the other one (A B, B A, ...), each run a fresh process on Ray with
``cluster.cpu_devices_per_node: 8``. Per run: trajectories/s over the whole run (episodes trained over the
summed iteration times, the first iteration not counted: it warms processes up and, under partial rollouts,
plays two batches; then whole pairs of iterations, see ``counted``) and per iteration, the turn rounds per
iteration, and the training reward of every iteration (the learning level at equal samples: both sides train
the same number of trajectories per iteration); ``--eval-episodes`` adds a held-out success rate after the
last iteration.

    python benchmarks/a1_long_tail.py --iterations 11 --rounds 2 --staleness 2 --eval-episodes 64
    python benchmarks/a1_long_tail.py --sides partial_async,whole_async,whole --staleness 2 --rounds 3

Writes ``benchmarks/results/a1_long_tail.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from a2_agentic_placements import EXAMPLE, warm_start  # noqa: E402
from common import RESULTS, median  # noqa: E402

PLACEMENT = "env: 1-4, rollout,actor: 0"
DEVICES = 8
SIDES = {"partial": (True, None), "whole": (False, None), "partial_async": (True, True), "whole_async": (False, True)}
"""name: (rollout.partial, env.async_steps; None: ``--async-steps``)"""
PAIRS = [("partial", "whole"), ("partial_async", "whole_async"), ("partial_async", "whole"), ("whole_async", "whole")]
"""The ratios reported, of the sides run (A / B by round)."""
LATENCY = "{dist: lognormal, median_s: 0.02, sigma: 1.5, max_s: 0.5}"


def overrides(model: Path, run_dir: Path, args: argparse.Namespace, side: str) -> list[str]:
    """One side's config: the example from the warm-started model, the long-tail tool, the plan."""
    partial, async_steps = SIDES[side]
    async_steps = bool(args.async_steps) if async_steps is None else async_steps
    env = "{digits: 3, tools: true, max_calls: 2, tool_latency_s: %s}" % args.latency
    return [f"model.path={model}", "model.create_tiny=false", "model.warm_start.steps=0", f"run_dir={run_dir}",
            f"steps={args.iterations}", f"seed={args.seed}", "metrics.sinks=[jsonl]",
            f"eval_every={args.iterations if args.eval_episodes else 0}", f"eval_episodes={args.eval_episodes}",
            f"cluster.cpu_devices_per_node={DEVICES}", f"placement={args.placement}", f"env.kwargs={env}",
            f"env.concurrent={str(bool(args.concurrent)).lower()}", f"algorithm.max_staleness={args.staleness}",
            f"rollout.partial={str(partial).lower()}", f"env.async_steps={str(async_steps).lower()}"]


def run_side(model: Path, args: argparse.Namespace, side: str) -> dict[str, Any]:
    """Train one side in this process; its per-iteration figures."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.autoplan.entry import train
    from m2flow.driver.registry import load_workflow_config
    from m2flow.runtime.logs import setup_logging
    from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC

    setup_logging(console=False)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="a1-tail-") as tmp:
        _, cfg = load_workflow_config(EXAMPLE, overrides(model, Path(tmp), args, side))
        result = train(AGENTIC, cfg)
    rows = [{"step_s": h["time/step"], "trajectories_per_s": h["perf/trajectories_per_s"],
             "trajectories": h["perf/trajectories_per_s"] * h["time/step"], "rounds": h.get("rollout/rounds"),
             "env_s": h["time/env_busy_s"], "generate_s": h["time/generate_busy_s"], "reward": h["reward/mean"],
             "resumed": h.get("rollout/partial_resumed_count", 0.0),
             "restarted": h.get("rollout/partial_restarted_count", 0.0), "rollout_s": h.get("time/rollout_s"),
             "train_s": h.get("time/train_busy")} for h in result.history]
    evals = {k: v for h in result.history for k, v in h.items() if k.startswith("eval/")}
    return {"partial": SIDES[side][0], "side": side, "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "iterations": rows, "eval": evals}


def counted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The iterations a run's figures count: after the first, in whole pairs. Under partial rollouts an
    iteration may play two batches in its rounds and the next hand out the batch held back without a round,
    so an odd count would tip the run towards the cheap or the dear half of that cycle."""
    rest = rows[1:]
    return rest[: len(rest) - len(rest) % 2]


def run_rate(rows: list[dict[str, Any]]) -> float:
    """Trajectories per second over these iterations: episodes trained over the summed iteration times."""
    return sum(x["trajectories"] for x in rows) / sum(x["step_s"] for x in rows)


def side_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side over its rounds: whole-run and median per-iteration trajectories/s, rounds, rewards."""
    rows = [row for r in runs for row in counted(r["iterations"])]
    per_run = [run_rate(counted(r["iterations"])) for r in runs]
    n = len(runs[0]["iterations"])
    reward_by_it = [round(median([r["iterations"][i]["reward"] for r in runs]), 4) for i in range(n)]
    return {"trajectories_per_s_run": [round(x, 2) for x in per_run],
            "trajectories_per_s_iteration_median": round(median([x["trajectories_per_s"] for x in rows]), 2),
            "step_s_median": round(median([x["step_s"] for x in rows]), 4),
            "rounds_mean": round(sum(x["rounds"] or 0.0 for x in rows) / len(rows), 3),
            "env_s_mean": round(sum(x["env_s"] for x in rows) / len(rows), 4),
            "generate_s_mean": round(sum(x["generate_s"] for x in rows) / len(rows), 4),
            "reward_by_iteration": reward_by_it,
            "reward_mean_all": round(median([sum(x["reward"] for x in r["iterations"]) / n for r in runs]), 4),
            "eval": [r["eval"] for r in runs], "load": [r["load"] for r in runs]}


def summarize(runs: dict[str, list[dict[str, Any]]], order: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The results record: each side's figures, the ratio of partial to whole by round and its median."""
    sides = {name: side_figures(rs) for name, rs in runs.items() if rs}
    ratios = {f"{a}/{b}": [round(x / y, 3) for x, y in zip(sides[a]["trajectories_per_s_run"],
                                                           sides[b]["trajectories_per_s_run"])]
              for a, b in PAIRS if a in sides and b in sides}
    first = next(iter(ratios.values()))
    by_round = ratios.get("partial/whole", first)
    return {"benchmark": "A1-long-tail", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "cpus": os.cpu_count(), "placement": args.placement, "staleness": args.staleness, "latency": args.latency,
            "env_concurrent": bool(args.concurrent), "async_steps": bool(args.async_steps), "iterations": args.iterations,
            "warm_steps": None if args.model else args.warm_steps, "order": order, "sides": sides,
            "ratio_by_round": by_round, "ratio_median": median(by_round),
            "ratios_by_round": ratios, "ratios_median": {k: median(v) for k, v in ratios.items()},
            "load_max": max(x for rs in runs.values() for r in rs for x in r["load"]), "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=11,
                   help="iterations per run (the first is not counted, then whole pairs)")
    p.add_argument("--rounds", type=int, default=2, help="A B rounds, each starting with the other side")
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--placement", default=PLACEMENT, help="the plan of both sides (env workers apart)")
    p.add_argument("--concurrent", type=int, default=1, help="env.concurrent: a worker's calls wait side by side")
    p.add_argument("--sides", default="partial,whole", help=f"the sides run, of {', '.join(SIDES)}")
    p.add_argument("--async-steps", type=int, default=0,
                   help="env.async_steps on both sides: a round takes the answers that have come, not all")
    p.add_argument("--latency", default=LATENCY, help="env.kwargs.tool_latency_s, YAML")
    p.add_argument("--warm-steps", type=int, default=1500, help="supervised warm-start steps of the policy")
    p.add_argument("--model", default=None, help="a warm-started model to reuse (no warm start then)")
    p.add_argument("--work", default=str(HERE.parent / "runs" / "a1_long_tail"), help="where the warm start goes")
    p.add_argument("--eval-episodes", type=int, default=0, help="held-out episodes after the last iteration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    p.add_argument("--out", default=str(RESULTS / "a1_long_tail.json"))
    p.add_argument("--resummarize", default=None, help="recompute the figures of a results file from its runs")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the side to run here: partial|whole
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_side(Path(args.model), args, args.one)))
        return
    if args.resummarize:
        path = Path(args.resummarize)
        old = json.loads(path.read_text())
        args.staleness, args.latency, args.concurrent = old["staleness"], old["latency"], old["env_concurrent"]
        args.async_steps = old.get("async_steps", False)
        args.placement = old["placement"]
        args.iterations, args.model, args.warm_steps = old["iterations"], old["warm_steps"] is None, old["warm_steps"]
        path.write_text(json.dumps({**summarize(old["runs"], old["order"], args), "command": old["command"]},
                                   indent=2) + "\n")
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import torch

    torch.set_num_threads(1)
    model = Path(args.model).resolve() if args.model else warm_start(Path(args.work), args.warm_steps, args.seed)
    print(f"model: {model}", file=sys.stderr, flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    chosen = args.sides.split(",")
    unknown = [n for n in chosen if n not in SIDES]
    if unknown or len(chosen) < 2:
        raise SystemExit(f"--sides: two or more of {', '.join(SIDES)}, got {args.sides!r}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    order: list[str] = []
    for round_ in range(args.rounds):
        names = chosen if round_ % 2 == 0 else chosen[::-1]  # A B, B A: neither side always first
        for name in names:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--model", str(model),
                   "--iterations", str(args.iterations), "--staleness", str(args.staleness),
                   "--placement", args.placement,
                   "--concurrent", str(args.concurrent), "--latency", args.latency,
                   "--async-steps", str(args.async_steps),
                   "--eval-episodes", str(args.eval_episodes), "--seed", str(args.seed)]
            with tempfile.TemporaryDirectory(prefix="a1-tail-cwd-") as cwd:
                proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"side {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            runs[name].append(json.loads(lines[-1]))
            order.append(name)
            tps = side_figures([runs[name][-1]])["trajectories_per_s_run"][0]
            load = runs[name][-1]["load"]
            print(f"round {round_} {name}: {tps:.1f} traj/s, load {load}", file=sys.stderr, flush=True)
    record = summarize(runs, order, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    sides = record["sides"]
    ratios = "; ".join(f"{k} {v:.3f}x (by round {record['ratios_by_round'][k]})"
                       for k, v in record["ratios_median"].items())
    rewards = ", ".join(f"{name} {fig['reward_mean_all']}" for name, fig in sides.items())
    print(f"A1 long tail (load up to {record['load_max']}): {ratios}; reward over the run: {rewards}")


if __name__ == "__main__":
    main()
