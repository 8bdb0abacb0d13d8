"""Benchmark E2 (learning): synchronous PPO vs bounded staleness at equal env steps.

E1's workload (8 envs in all, split over the env ranks, x 256 steps per iteration, SB3's PPO defaults) trained to the
same number of env steps with ``algorithm.max_staleness`` 0 and S, for each seed, the two sides
alternating (seed 0: sync, S; seed 1: sync, S; ...), each run in a fresh process. Reports per run
the mean raw return of the last 20 episodes at the end (``env/episode_return_recent``, E1's window), a
deterministic evaluation of the final policy, and the loop's env-steps/s.

    python benchmarks/e2_staleness_learning.py --steps 100000 --seeds 0,1,2 --staleness 1

Writes ``benchmarks/results/e2_staleness_learning.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RETURN_WINDOW = 20
"""Finished episodes averaged in the end-of-run return: E1's (and its SB3 runs') ``--last-n``."""


def run_one(staleness: int, seed: int, steps: int, placement: str, env_id: str) -> dict:
    """One training run in this process; its end-of-run returns and rate."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.config import from_dict
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from m2flow.workflows.embodied.config import EmbodiedConfig

    setup_logging(console=False)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="e2l-") as tmp:
        env_ranks = from_dict(EmbodiedConfig, {"placement": placement}).placed()["env"].world_size
        cfg = from_dict(EmbodiedConfig, {
            "cluster": {"cpu_devices_per_node": 8},
            "placement": placement,
            # E1's workload whatever the plan: 8 envs in all, split over the env ranks.
            "env": {"env_id": env_id, "num_envs": 8 // env_ranks},
            "return_window": RETURN_WINDOW,
            "rollout_steps": 256,
            "total_env_steps": steps,
            "algorithm": {"max_staleness": staleness},
            "seed": seed,
            "run_dir": tmp,
            "eval_every": 10**9,  # once, after the last iteration
            "eval_episodes": 5,
            "metrics": {"sinks": []},
        })
        result = train(EMBODIED, cfg)
    last = result.history[-1]
    return {"staleness": staleness, "seed": seed, "steps": int(last["env/total_steps"]),
            "return_recent": last["env/episode_return_recent"], "eval_return": last["eval/return"],
            "loop_steps_per_s": last["env/total_steps"] / result.loop_s, "loop_s": result.loop_s,
            "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--staleness", type=int, default=1, help="the asynchronous side's algorithm.max_staleness")
    p.add_argument("--placement", default="env,rollout: 0, actor: 1")
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--out", default=str(HERE / "results" / "e2_staleness_learning.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "staleness,seed": one run here, JSON out
    args = p.parse_args()
    if args.one:
        staleness, seed = (int(x) for x in args.one.split(","))
        print(json.dumps(run_one(staleness, seed, args.steps, args.placement, args.env)))
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    runs = []
    for seed in (int(x) for x in args.seeds.split(",")):
        for staleness in (0, args.staleness):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", f"{staleness},{seed}", "--steps",
                   str(args.steps), "--placement", args.placement, "--env", args.env]
            with tempfile.TemporaryDirectory(prefix="e2l-cwd-") as cwd:
                proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"run {staleness},{seed} failed:\n{proc.stderr[-2000:]}")
            runs.append(json.loads(lines[-1]))
            print(json.dumps(runs[-1]), file=sys.stderr)
    summary = {}
    for s in (0, args.staleness):
        side = [r for r in runs if r["staleness"] == s]
        summary[f"staleness_{s}"] = {k: round(statistics.mean(r[k] for r in side), 3)
                                     for k in ("return_recent", "eval_return", "loop_steps_per_s")}
        returns = [r["return_recent"] for r in side]
        summary[f"staleness_{s}"].update(return_median=round(statistics.median(returns), 3),
                                         return_min=round(min(returns), 3), return_max=round(max(returns), 3))
    record = {"benchmark": "E2-learning", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "env": args.env, "placement": args.placement, "return_window": RETURN_WINDOW, "summary": summary, "runs": runs,
              "load_max": max(x for r in runs for x in r["load"])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"E2 learning (load up to {record['load_max']}) | "
          + " | ".join(f"{k}: {v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
