"""Benchmark E2: the same embodied PPO workload under different execution plans.

E1's workload (HalfCheetah-v5, 8 envs x 256 steps per iteration, minibatch 64, 10 epochs) runs in
each plan below for a few iterations; plans run in rotation (A B C A B C ...), each in a fresh
process, and the figures are medians over iterations and rounds. For every plan the step time is
set against the ideal its stages allow: the rollout phase cannot be shorter than its busiest stage
(the env ranks' simulation, or the rollout ranks' inference; both at once where they share a
process), and the update cannot start before the last trajectory arrives, so

    ideal = max(env stage busy, rollout stage busy) + actor busy     (per iteration)

With ``--staleness 0,1`` every plan but the baseline (``collocated-sequential``, always
synchronous) runs once per value of ``algorithm.max_staleness`` in each round (``PLAN@s1`` in the
results). With staleness the env ranks collect the next iteration while the actor trains, so the
update no longer adds to the rollout phase: the ideal becomes the busiest device, the busy time of
every component on it summed (waits for a turn on a shared device excluded), the maximum over
devices; that is the busiest component when components have devices of their own.

    python benchmarks/e2_placements.py                      # every plan, 6 iterations, 2 rounds
    python benchmarks/e2_placements.py --plans collocated-sequential,hybrid-pipelined --iterations 10
    python benchmarks/e2_placements.py --workload vla --staleness 0,1   # V2: V1's pixel task and VLA

``--workload vla`` runs V1's workload instead (``examples/embodied/metaworld_vla_ppo.yaml``: MetaWorld
reach-v3 at 64x64 from pixels and an instruction, the small VLA, 8 envs x 64 steps per iteration; the
policy starts from its random initialisation, which costs the same per step as the warm start).
``--workload vla-chunk4``: the same VLA with action chunks of 4 (``policy.vla.chunk=4``, parallel
decoding): 8 envs x 64 decisions, 2,048 env steps an iteration, one frame rendered per decision.

Writes ``benchmarks/results/e2_placements.json`` (or ``--out``) and prints one summary line.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# name: (placement, pipeline stages, env and rollout fused when collocated)
PLANS: dict[str, tuple[str, int, bool]] = {
    # env and rollout ranks on one device take turns, one message each way per step
    "collocated-sequential": ("env,rollout,actor: 0", 1, False),
    # the same devices, the policy inside the env process (no messages)
    "collocated-fused": ("env,rollout,actor: 0", 1, True),
    # env, rollout and actor each on their own device; two stages overlap simulation and inference
    "disaggregated-pipelined": ("env: 0, rollout: 1, actor: 2", 2, True),
    # env and rollout on their own devices, pipelined; the actor data-parallel over both
    "hybrid-pipelined": ("env: 0, rollout: 1, actor: 0-1", 2, True),
    # two env ranks of 4 envs (one per device, simulating in parallel), each in two stages served
    # by one rollout rank; one actor rank
    "hybrid-pipelined-2env": ("env: 0-1, rollout: 1, actor: 0", 2, True),
    # two fused env ranks of 4 envs, one per device; one actor rank (E1's plan)
    "collocated-fused-2ranks": ("env,rollout: 0-1, actor: 0", 1, True),
    # the policy in the env process on one device, the actor on the other: with staleness the
    # collection of iteration k + 1 overlaps the update on k
    "hybrid-fused-split": ("env,rollout: 0, actor: 1", 1, True),
    # the plan search's first choice for the VLA example at staleness 0 (`m2flow plan search` over a
    # profile on two devices): env and actor over both devices, the rollout apart on device 0, two stages
    "planner-choice-vla": ("env,actor: 0-1, rollout: 0", 2, False),
    # every component on both devices, the policy in the env processes (two env ranks of 4 envs, the actor
    # data-parallel over both): the plan search's first choice for the VLA with chunks of 4 at staleness 1
    "collocated-fused-both": ("env,rollout,actor: 0-1", 1, True),
}
BASELINE = "collocated-sequential"  # always synchronous: what every plan is compared with
VLA_EXAMPLE = ROOT / "examples" / "embodied" / "metaworld_vla_ppo.yaml"
VLA_ROLLOUT_STEPS = 64  # V2's iteration (8 envs x 64 steps), as measured; the example itself runs whole episodes
ENVS = 8  # envs per iteration over all env ranks, in every plan
VLA_CHUNKS = {"vla": 1, "vla-chunk4": 4}
"""The VLA workloads and their action chunks: with chunks an iteration is 8 envs x 64 decisions of 4 env steps."""


def workload_config(workload: str, placement: str, stages: int, fused: bool, env_ranks: int, iterations: int,
                    env_id: str, compile: bool, staleness: int, seed: int, run_dir: str, traced: bool):
    """The run's config: E1's MuJoCo workload (``mujoco``) or V1's pixel task with the VLA (``vla``)."""
    from m2flow.config import from_dict
    from m2flow.config.loader import load_config
    from m2flow.workflows.embodied.config import EmbodiedConfig

    if workload in VLA_CHUNKS:
        if compile:
            raise SystemExit("--compile applies to the MLP actor-critic, not to the VLA workload")
        os.environ.setdefault("MUJOCO_GL", "egl")
        steps, chunk = VLA_ROLLOUT_STEPS, VLA_CHUNKS[workload]
        chunked = [f"policy.vla.chunk={chunk}", "policy.vla.decoding=parallel"] if chunk > 1 else []
        return load_config(EmbodiedConfig, VLA_EXAMPLE, [*chunked, 
            "cluster.cpu_devices_per_node=8", f"placement={placement}", f"pipeline_stages={stages}",
            f"env.num_envs={ENVS // env_ranks}", f"rollout_steps={steps}",
            f"total_env_steps={iterations * ENVS * steps * chunk}",
            f"rollout.fuse_with_env={str(fused).lower()}", f"algorithm.max_staleness={staleness}", f"seed={seed}",
            f"run_dir={run_dir}", "metrics.sinks=[]", f"trace={str(traced).lower()}", "policy.init_from=null",
            "checkpoint_every=0"])
    return from_dict(EmbodiedConfig, {
        "cluster": {"cpu_devices_per_node": 8},
        "placement": placement,
        "pipeline_stages": stages,
        "env": {"env_id": env_id, "num_envs": ENVS // env_ranks},
        "rollout_steps": 256,
        "total_env_steps": iterations * ENVS * 256,
        "rollout": {"fuse_with_env": fused},
        "actor": {"compile": compile},
        "algorithm": {"max_staleness": staleness},
        "seed": seed,
        "run_dir": run_dir,
        "metrics": {"sinks": []},
        "trace": traced,
    })


def run_plan(name: str, iterations: int, env_id: str, seed: int, trace_dir: str | None = None,
             compile: bool = False, staleness: int = 0, workload: str = "mujoco") -> dict:
    """Train ``iterations`` iterations under plan ``name`` in this process; per-iteration stage times.

    With ``trace_dir`` the run is traced and its directory kept there (``m2flow report`` reads it).
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.config import from_dict
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from m2flow.workflows.embodied.config import EmbodiedConfig
    from m2flow.runtime.logs import setup_logging

    setup_logging(console=False)
    placement, stages, fused = PLANS[name]
    cfg = from_dict(EmbodiedConfig, {"placement": placement, "cluster": {"cpu_devices_per_node": 8}})
    placed = cfg.placed()
    env_ranks = placed["env"].world_size
    devices = {c: placed[c].devices for c in ("env", "rollout", "actor")}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="e2-") as tmp:
        run_dir = tmp if trace_dir is None else str(Path(trace_dir) / name)
        if trace_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        cfg = workload_config(workload, placement, stages, fused, env_ranks, iterations, env_id, compile, staleness,
                              seed, run_dir, trace_dir is not None)
        result = train(EMBODIED, cfg)
    rows = []
    for h in result.history[1:]:  # the first iteration warms caches and connections up
        env_stage = h["time/env_busy_s"] + (h["time/rollout_busy_s"] if result.plan.fused("rollout") else 0.0)
        rollout_stage = 0.0 if result.plan.fused("rollout") else h["time/rollout_busy_s"]
        if staleness == 0:
            ideal = max(env_stage, rollout_stage) + h["time/actor_busy_s"]
        else:  # the busiest device: what runs on it adds up, the devices overlap
            busy = {"env": env_stage, "rollout": rollout_stage, "actor": h["time/actor_busy_s"]}
            ideal = max(sum(busy[c] for c in busy if d in devices[c]) for d in set().union(*devices.values()))
        rows.append({"step_s": h["time/iteration_s"], "env_stage_s": env_stage, "rollout_stage_s": rollout_stage,
                     "actor_s": h["time/actor_busy_s"], "ideal_s": ideal,
                     "busiest_s": max(env_stage, rollout_stage, h["time/actor_busy_s"]),
                     "actor_lock_wait_s": h.get("time/actor_lock_wait_s", 0.0)})
    # the machine is shared: the 1-minute load average around the run says how quiet it was
    key = name if staleness == 0 else f"{name}@s{staleness}"
    return {"plan": key, "workload": workload, "placement": placement, "stages": stages, "mode": result.mode, "fused": result.plan.fused("rollout"),
            "compile": compile, "staleness": staleness, "load": [round(load_before, 2), round(os.getloadavg()[0], 2)], "iterations": rows}


def summarize(runs: list[dict], plans: list[str]) -> dict:
    out = {}
    for name in plans:
        rows = [r for run in runs if run["plan"] == name for r in run["iterations"]]
        if not rows:
            continue
        med = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}
        med["step_over_ideal"] = round(statistics.median(r["step_s"] / r["ideal_s"] for r in rows), 3)
        med["step_over_busiest"] = round(statistics.median(r["step_s"] / r["busiest_s"] for r in rows), 3)
        first = next(run for run in runs if run["plan"] == name)
        loads = [x for run in runs if run["plan"] == name for x in run.get("load", [])]
        out[name] = {"placement": first["placement"], "stages": first["stages"], "mode": first["mode"],
                     "fused": first["fused"], "staleness": first.get("staleness", 0), **med, "iterations": len(rows),
                     "load_max": max(loads) if loads else None}
    base = out.get(BASELINE)
    if base:
        for entry in out.values():
            entry["speedup_vs_collocated_sequential"] = round(base["step_s"] / entry["step_s"], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated, from {list(PLANS)}")
    p.add_argument("--iterations", type=int, default=6, help="iterations per run (the first is not counted)")
    p.add_argument("--rounds", type=int, default=2, help="rotations over the plans")
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium id (the mujoco workload)")
    p.add_argument("--workload", choices=["mujoco", *VLA_CHUNKS], default="mujoco",
                   help="mujoco: E1's workload (--env); vla: V1's pixel task with the small VLA (V2); vla-chunk4: "
                        "the same with chunks of 4 actions, parallel decoding")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    p.add_argument("--out", default=str(HERE / "results" / "e2_placements.json"), help="result JSON path")
    p.add_argument("--retries", type=int, default=4, help="reruns of a plan whose run failed")
    p.add_argument("--trace-dir", default=None,
                   help="trace every run and keep its run directory here (DIR/PLAN; the last round's)")
    p.add_argument("--compile", action="store_true", help="actor.compile in every plan (compiled PPO steps)")
    p.add_argument("--staleness", default="0",
                   help=f"comma-separated algorithm.max_staleness values for every plan but {BASELINE} "
                        "(which stays synchronous)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # run one plan here, JSON out
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_plan(args.one, args.iterations, args.env, args.seed, args.trace_dir, args.compile,
                                  int(args.staleness), args.workload)))
        return
    plans = [x for x in args.plans.split(",") if x]
    unknown = [x for x in plans if x not in PLANS]
    if unknown:
        raise SystemExit(f"unknown plans {unknown}; valid: {list(PLANS)}")
    runs = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    stalenesses = [int(x) for x in args.staleness.split(",")]
    variants = [(name, s) for name in plans for s in ([0] if name == BASELINE else stalenesses)]
    for _ in range(args.rounds):
        for name, staleness in variants:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--iterations",
                   str(args.iterations), "--env", args.env, "--seed", str(args.seed), "--staleness", str(staleness),
                   "--workload", args.workload]
            if args.trace_dir:
                cmd += ["--trace-dir", str(Path(args.trace_dir).resolve())]
            if args.compile:
                cmd.append("--compile")
            for attempt in range(args.retries + 1):  # a loaded machine can time Ray's start-up out
                with tempfile.TemporaryDirectory(prefix="e2-cwd-") as cwd:
                    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                          timeout=args.timeout)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode == 0 and lines:
                    break
                print(f"plan {name} failed (attempt {attempt + 1}, exit {proc.returncode}):\n{proc.stderr[-1500:]}",
                      file=sys.stderr)
                time.sleep(20)
            else:
                raise RuntimeError(f"plan {name} failed {args.retries + 1} times")
            runs.append(json.loads(lines[-1]))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "iterations"}), file=sys.stderr)
    summary = summarize(runs, list(dict.fromkeys(r["plan"] for r in runs)))
    record = {"benchmark": "E2" if args.workload == "mujoco" else "V2", "workload": args.workload, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "cpus": os.cpu_count(), "load_max": max(x for r in runs for x in r["load"]),
              "summary": summary, "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    parts = [f"{n}: {e['step_s']:.3f}s/step, {e['step_over_ideal']}x ideal, "
             f"{e.get('speedup_vs_collocated_sequential', 1.0)}x vs collocated-sequential"
             for n, e in summary.items()]
    print(f"{record['benchmark']} (load up to {record['load_max']}) | " + " | ".join(parts))


if __name__ == "__main__":
    main()
