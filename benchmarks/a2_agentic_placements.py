"""Benchmark A2: the agentic calculator workload under different execution plans, with a tool of varying latency.

The workload is ``examples/agentic/calculator_grpo.yaml`` (8 groups x 4 episodes per iteration, up to 3
turns, GRPO), from a model warm-started once at the start (``--warm-steps`` supervised steps on the imperfect
teacher, so the model calls the tool), with ``env.kwargs.tool_latency_s`` (default 0-50 ms per call, drawn
uniformly, seeded by the episode). Every plan runs on Ray with ``cluster.cpu_devices_per_node: 8`` (logical
devices on this machine's cores), in a fresh process, plans in rotation, each round starting one plan
later (A B C, B C A, ...), and the figures are medians over the iterations after the first of every round:

- ``collocated-sequential``: env, rollout and actor on one device, taking turns; one env worker that steps
  its episodes one after the other (the baseline);
- ``env-apart``: four env workers on devices of their own, stepped side by side, rollout and actor sharing a
  device; synchronous;
- ``env-apart-streaming``: the same with ``algorithm.max_staleness: 1``: the episodes of iteration k + 1 are
  played while the actor trains on k;
- ``disaggregated-streaming``: four env workers, rollout and actor each on devices of their own, staleness 1;
- ``auto``: what ``placement: auto`` chooses for the workload (it profiles each component first, a few short
  runs, once, before the rounds; ``auto.json`` records its choice and prediction).

Per plan: trajectories/s (episodes per second of iteration time), the iteration time, and the busy time of
each component per iteration (env rounds, generation rounds, the actor's computing); ``ideal`` is the busiest
component (what a perfect overlap of the three would take).

    python benchmarks/a2_agentic_placements.py --iterations 6 --rounds 2

Writes ``benchmarks/results/a2_agentic_placements.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "examples" / "agentic" / "calculator_grpo.yaml"
DEVICES = 8

# name: (placement, algorithm.max_staleness)
PLANS: dict[str, tuple[str, int]] = {
    "collocated-sequential": ("env,rollout,actor: 0", 0),
    "env-apart": ("env: 1-4, rollout,actor: 0", 0),
    "env-apart-streaming": ("env: 1-4, rollout,actor: 0", 1),
    "disaggregated-streaming": ("env: 1-4, rollout: 0, actor: 5", 1),
}
BASELINE = "collocated-sequential"
AUTO = "auto"


def overrides(model: Path, run_dir: Path, latency: tuple[float, float], iterations: int, seed: int) -> list[str]:
    """The workload of every plan: the example from the warm-started model, the tool's latency, no evaluation."""
    return [f"model.path={model}", "model.create_tiny=false", "model.warm_start.steps=0", f"run_dir={run_dir}",
            f"steps={iterations}", "eval_every=0", f"seed={seed}", "metrics.sinks=[jsonl]",
            f"cluster.cpu_devices_per_node={DEVICES}",
            "env.kwargs={digits: 3, tools: true, max_calls: 2, tool_latency_s: [%s, %s]}" % latency]


def warm_start(work: Path, steps: int, seed: int) -> Path:
    """The example's model warm-started for ``steps`` steps (the A1 workload's policy: it calls the tool)."""
    from m2flow.driver.registry import load_workflow_config
    from m2flow.workflows.agentic.warm_start import prepare_model, warm_start_model

    _, cfg = load_workflow_config(EXAMPLE, [f"model.path={work / 'base'}", f"run_dir={work / 'ws'}", f"seed={seed}",
                                            f"model.warm_start.steps={steps}", "model.warm_start.threads=1"])
    return warm_start_model(cfg, prepare_model(cfg.model))


def choose_auto(model: Path, work: Path, latency: tuple[float, float], iterations: int, seed: int) -> dict[str, Any]:
    """What ``placement: auto`` chooses for the workload (profiling first): its record and the placement to run."""
    from m2flow.autoplan.auto import resolve
    from m2flow.driver.registry import load_workflow_config

    run_dir = work / "auto"
    spec, cfg = load_workflow_config(EXAMPLE, [*overrides(model, run_dir, latency, iterations, seed), "placement=auto"])
    start = time.perf_counter()
    choice = resolve(spec, cfg)
    record = json.loads((run_dir / "auto.json").read_text())
    profile = json.loads((run_dir / "profile.json").read_text()) if (run_dir / "profile.json").exists() else {}
    shares = {c: e.get("cpu_share", 1.0) for c, e in profile.get("components", {}).items()}
    return {"record": record, "runs_with": record.get("runs_with", {}), "seconds": round(time.perf_counter() - start, 1),
            "cpu_share": shares,
            "placement": choice.cfg.placement, "staleness": choice.cfg.algorithm.max_staleness,
            "fuse": choice.cfg.env.fuse_with_rollout}


def run_plan(model: Path, placement: str, staleness: int, fuse: bool, latency: tuple[float, float],
             iterations: int, seed: int) -> dict[str, Any]:
    """Train ``iterations`` iterations under one plan in this process; per-iteration times."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.driver.registry import load_workflow_config
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.entry import train
    from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC

    setup_logging(console=False)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="a2-") as tmp:
        _, cfg = load_workflow_config(EXAMPLE, [
            *overrides(model, Path(tmp), latency, iterations, seed), f"placement={placement}",
            f"algorithm.max_staleness={staleness}", f"env.fuse_with_rollout={str(fuse).lower()}"])
        result = train(AGENTIC, cfg)
    rows = []
    for h in result.history[1:]:  # the first iteration warms processes and connections up
        busy = {"env": h["time/env_busy_s"], "generate": h["time/generate_busy_s"], "actor": h["time/train_busy"]}
        rows.append({"step_s": h["time/step"], "trajectories_per_s": h["perf/trajectories_per_s"],
                     "env_s": busy["env"], "generate_s": busy["generate"], "actor_s": busy["actor"],
                     "ideal_s": max(busy.values()), "tool_calls": h.get("tool/ok", 0.0),
                     "reward": h["reward/mean"]})
    return {"placement": placement, "staleness": staleness, "fuse": fuse, "mode": result.plan.mode,
            "load": [round(load_before, 2), round(os.getloadavg()[0], 2)], "iterations": rows}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per plan, medians over every counted iteration of every round; speed-ups against the baseline."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["plan"] for r in runs):
        mine = [r for r in runs if r["plan"] == name]
        rows = [row for r in mine for row in r["iterations"]]
        med = {k: round(statistics.median(row[k] for row in rows), 4) for k in rows[0]}
        med["step_over_ideal"] = round(statistics.median(row["step_s"] / row["ideal_s"] for row in rows), 3)
        out[name] = {"placement": mine[0]["placement"], "staleness": mine[0]["staleness"], "fuse": mine[0]["fuse"],
                     "mode": mine[0]["mode"], **med, "iterations": len(rows),
                     "load_max": max(x for r in mine for x in r["load"])}
    base = out.get(BASELINE)
    if base:
        for entry in out.values():
            entry["speedup_vs_sequential"] = round(base["step_s"] / entry["step_s"], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plans", default=",".join([*PLANS, AUTO]), help=f"comma-separated, from {[*PLANS, AUTO]}")
    p.add_argument("--iterations", type=int, default=8, help="iterations per run (the first is not counted)")
    p.add_argument("--rounds", type=int, default=2, help="rotations over the plans")
    p.add_argument("--latency", default="0,0.05", help="the tool's latency range per call, seconds: low,high")
    p.add_argument("--warm-steps", type=int, default=1500,
                   help="supervised warm-start steps of the policy (the shipped example's 1500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    p.add_argument("--out", default=str(HERE / "results" / "a2_agentic_placements.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # JSON of one run's settings: run it here
    args = p.parse_args()
    latency = tuple(float(x) for x in args.latency.split(","))
    if args.one:
        one = json.loads(args.one)
        print(json.dumps(run_plan(Path(one["model"]), one["placement"], one["staleness"], one["fuse"], latency,
                                  args.iterations, args.seed)))
        return
    plans = [x for x in args.plans.split(",") if x]
    unknown = [x for x in plans if x not in PLANS and x != AUTO]
    if unknown:
        raise SystemExit(f"unknown plans {unknown}; valid: {[*PLANS, AUTO]}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import torch

    torch.set_num_threads(1)
    from m2flow.runtime.logs import setup_logging

    setup_logging(console=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    work = Path(tempfile.mkdtemp(prefix="a2-work-"))
    try:
        model = warm_start(work, args.warm_steps, args.seed)
        settings = {name: {"placement": pl, "staleness": s, "fuse": False} for name, (pl, s) in PLANS.items()
                    if name in plans}
        auto = None
        if AUTO in plans:
            auto = choose_auto(model, work, latency, args.iterations, args.seed)
            settings[AUTO] = {"placement": auto["placement"], "staleness": auto["staleness"], "fuse": auto["fuse"]}
            print(f"auto chose {settings[AUTO]} ({auto['seconds']} s of profiling and search)", file=sys.stderr)
        runs = []
        names = list(settings)
        for round_ in range(args.rounds):
            # Each round starts one plan later (A B C, B C A, ...): no plan always runs first or last, where a
            # machine whose load drifts during the run would favour it.
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                one = settings[name]
                cmd = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps({**one, "model": str(model)}),
                       "--iterations", str(args.iterations), "--latency", args.latency, "--seed", str(args.seed)]
                with tempfile.TemporaryDirectory(prefix="a2-cwd-") as cwd:
                    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=args.timeout)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode != 0 or not lines:
                    raise RuntimeError(f"plan {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
                runs.append({"plan": name, **json.loads(lines[-1])})
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "iterations"}), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs)
    measured = {n: e for n, e in summary.items() if n != AUTO}
    best = max(measured, key=lambda n: measured[n]["trajectories_per_s"]) if measured else None
    record: dict[str, Any] = {
        "benchmark": "A2", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpus": os.cpu_count(),
        "latency_s": list(latency), "load_max": max(x for r in runs for x in r["load"]), "summary": summary,
        "best": best, "auto": auto, "runs": runs}
    if auto is not None and best is not None and AUTO in summary:
        record["auto_over_best"] = round(summary[AUTO]["trajectories_per_s"] / summary[best]["trajectories_per_s"], 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    parts = [f"{n}: {e['trajectories_per_s']:.1f} traj/s, {e.get('speedup_vs_sequential', 1.0)}x sequential, "
             f"{e['step_over_ideal']}x ideal" for n, e in summary.items()]
    print(f"A2 (load up to {record['load_max']}) | " + " | ".join(parts)
          + (f" | auto/best {record['auto_over_best']}" if "auto_over_best" in record else ""))


if __name__ == "__main__":
    main()
