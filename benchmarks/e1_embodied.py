"""Benchmark E1: embodied PPO on MuJoCo, whole-loop env-steps/s and return at equal env steps.

Every side trains PPO with the same hyper-parameters (8 envs x 256 steps per update, minibatch 64,
10 epochs, gamma 0.99, GAE lambda 0.95, clip 0.2, lr 3e-4, obs + reward normalisation) in its own
process and prints one JSON line; the sides run alternately (A B A B ...) and the figures are
medians, with speed ratios taken pair by pair. The limit to compare with is the raw vector-env
stepping rate with random actions, measured here for the m2flow env adapter and bare gymnasium.

The m2flow side is ``m2flow.workflows.embodied.train`` with ``examples/embodied/halfcheetah_ppo.yaml``'s
settings (``--m2flow-placement`` picks the plan; the 8 envs are split evenly over the env ranks),
run by this same script in a child process (``--m2flow-side``). Its wall time is the training
loop's, as the peers' is their ``learn()`` call's: Ray start-up and worker launch are reported apart.

    python benchmarks/e1_embodied.py --setup                  # peer venv: benchmarks/.venvs/sb3
    python benchmarks/e1_embodied.py --steps 20000 --repeats 2
    python benchmarks/e1_embodied.py --envs HalfCheetah-v5,Hopper-v5 --steps 300000 --seeds 0,1,2
    python benchmarks/e1_embodied.py --raw-only               # just the stepping-rate limit

Writes ``benchmarks/results/e1_embodied.json`` (or ``--out``) and prints one summary line.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SB3_VENV = HERE / ".venvs" / "sb3"
# The peer's own environment; torch pinned to the release m2flow uses (a CPU build is served here).
SB3_PACKAGES = [
    "torch==2.13.0",
    "stable-baselines3==2.9.2",
    "gymnasium[mujoco]==1.4.0",
    "mujoco==4.0.0",
    "imageio",
]


@dataclass(frozen=True)
class Side:
    """One contender: the program that trains, the Python that runs it, why it cannot run here."""

    name: str
    python: Callable[[], str]
    script: Path | None
    unavailable: Callable[[], str | None]
    extra: Callable[[argparse.Namespace], list[str]] = lambda args: []

    def command(self, args: argparse.Namespace, env: str, seed: int, threads: int) -> list[str]:
        """The command line of one training run; every side takes the same flags."""
        return [
            self.python(), str(self.script), *self.extra(args),
            "--env", env, "--steps", str(args.steps), "--seed", str(seed), "--threads", str(threads),
            "--last-n", str(args.last_n), "--checkpoints", args.checkpoints,
        ]


def _sb3_python() -> str:
    return str(SB3_VENV / "bin" / "python")


def _sb3_missing() -> str | None:
    return None if Path(_sb3_python()).exists() else f"no {SB3_VENV}; run with --setup first"


SIDES: dict[str, Side] = {
    "sb3": Side("sb3", _sb3_python, HERE / "peers" / "sb3_ppo.py", _sb3_missing),
    "cleanrl": Side("cleanrl", lambda: sys.executable, HERE / "peers" / "cleanrl_ppo.py", lambda: None),
    "m2flow": Side(
        "m2flow", lambda: sys.executable, Path(__file__).resolve(), lambda: None,
        lambda args: ["--m2flow-side", "--m2flow-placement", args.m2flow_placement],
    ),
    # the same with actor.compile: the minibatch step compiled at start-up (not in the timed loop)
    "m2flow+compile": Side(
        "m2flow+compile", lambda: sys.executable, Path(__file__).resolve(), lambda: None,
        lambda args: ["--m2flow-side", "--m2flow-placement", args.m2flow_placement, "--m2flow-compile"],
    ),
}


def m2flow_side(args: argparse.Namespace) -> dict:
    """One m2flow training run in this process, reported in the peers' JSON format."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.config import from_dict
    from m2flow.driver.registry import load_workflow_config
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from m2flow.workflows.embodied.config import EmbodiedConfig
    from m2flow.runtime.placement import NodeLayout, parse_placement
    from m2flow.runtime.logs import setup_logging

    setup_logging(console=False)
    env_ranks = parse_placement(args.m2flow_placement, NodeLayout((64,)), ("env", "rollout", "actor"))["env"].world_size
    if 8 % env_ranks:
        raise SystemExit(f"--m2flow-placement: 8 envs do not split over {env_ranks} env ranks")
    _, base = load_workflow_config(ROOT / "examples" / "embodied" / "halfcheetah_ppo.yaml")
    with tempfile.TemporaryDirectory(prefix="e1-m2flow-") as run_dir:
        data = {
            "cluster": {"cpu_devices_per_node": 8},
            "placement": args.m2flow_placement,
            "env": {"env_id": args.env, "num_envs": 8 // env_ranks},
            "rollout_steps": 2048 // 8,
            "total_env_steps": args.steps,
            "policy": {"hidden_sizes": base.policy.hidden_sizes, "activation": base.policy.activation},
            "algorithm": {"epochs": 10, "minibatch_size": 64, "lr": 3e-4, "gamma": 0.99, "gae_lambda": 0.95,
                          "clip": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5},
            "env_worker": {"num_threads": args.threads},
            "rollout": {"num_threads": args.threads},
            "actor": {"num_threads": args.threads, "compile": args.m2flow_compile},
            "seed": args.seed,
            "run_dir": run_dir,
            "metrics": {"sinks": []},
        }
        result = train(EMBODIED, from_dict(EmbodiedConfig, data))
    checkpoints = sorted(int(c) for c in args.checkpoints.split(",") if c)
    noted: dict[str, float | None] = {}
    boundaries = [int(h["env/total_steps"]) for h in result.history]
    for c in checkpoints:
        # as the peers: the recent mean when the step count first passes the checkpoint
        at = next((b for b in boundaries if b >= c), None)
        if at is not None:
            seen = [r for s, r in result.episodes if s <= at][-args.last_n:]
            noted[str(c)] = float(np.mean(seen)) if seen else None
    last = [r for _, r in result.episodes][-args.last_n:]
    steps = boundaries[-1] if boundaries else 0
    wall = result.loop_s
    return {
        "side": "m2flow+compile" if args.m2flow_compile else "m2flow",
        "env": args.env,
        "seed": args.seed,
        "threads": args.threads,
        "placement": args.m2flow_placement,
        "mode": result.mode + (" (fused)" if result.plan.fused("rollout") else ""),
        "steps": steps,
        "wall_s": round(wall, 3),
        "startup_s": round(result.startup_s, 3),
        "compiled_updates": sum(h.get("actor/compiled", 0.0) for h in result.history),
        "env_steps_per_s": round(steps / wall, 1) if wall else None,
        "update_frac": round(sum(h["time/actor_busy_s"] for h in result.history) / wall, 3) if wall else None,
        "mean_return": float(np.mean(last)) if last else None,
        "last_n": args.last_n,
        "episodes": len(result.episodes),
        "checkpoints": noted,
    }


def setup() -> None:
    """Create the SB3 peer's virtual environment and install its pinned packages."""
    if _sb3_missing():
        subprocess.run([sys.executable, "-m", "venv", str(SB3_VENV)], check=True)
    subprocess.run([_sb3_python(), "-m", "pip", "install", "-q", *SB3_PACKAGES], check=True)
    print(f"sb3 peer ready in {SB3_VENV}")


def run_side(side: Side, args: argparse.Namespace, env: str, seed: int, threads: int) -> dict:
    """One training run in a fresh process (its own cwd, so MuJoCo's log file lands there)."""
    cmd = side.command(args, env, seed, threads)
    child_env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="e1-") as cwd:
        proc = subprocess.run(cmd, cwd=cwd, env=child_env, capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def raw_step_rates(env_id: str, num_envs: int, steps: int, repeats: int) -> dict:
    """Random-action stepping rate (env-steps/s) of m2flow's VecEnv (with and without normalisation)
    and of bare gymnasium ``SyncVectorEnv``, measured in rotation; ratios are taken round by round."""
    import gymnasium as gym

    from m2flow.envs import EnvConfig, VecEnv

    contenders = {
        "m2flow": VecEnv(EnvConfig(env_id=env_id, num_envs=num_envs)),
        "m2flow_unnormalized": VecEnv(
            EnvConfig(env_id=env_id, num_envs=num_envs, normalize_obs=False, normalize_reward=False)
        ),
        "gymnasium": gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync"),
    }
    for i, venv in enumerate(contenders.values()):
        venv.reset(seed=i) if isinstance(venv, gym.vector.VectorEnv) else venv.reset()
    space = contenders["m2flow"].single_action_space
    rng = np.random.default_rng(0)
    if isinstance(space, gym.spaces.Box):
        actions = rng.uniform(space.low, space.high, size=(steps, num_envs, *space.shape)).astype(space.dtype)
    else:
        actions = rng.integers(0, space.n, size=(steps, num_envs))

    def rate(step: Callable[[np.ndarray], object]) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for a in actions:
            step(a)
        n = steps * num_envs
        return n / (time.perf_counter() - t0), n / (time.process_time() - c0)

    # Per CPU-second rates too: on a shared machine they move far less with the neighbours' load.
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, venv in contenders.items():
            rates[name].append(rate(venv.step))
    for venv in contenders.values():
        venv.close()
    out: dict = {
        "env": env_id,
        "num_envs": num_envs,
        "note": "gymnasium's default next-step autoreset spends one step per episode on a reset alone",
    }
    for name, values in rates.items():
        out[f"{name}_env_steps_per_s"] = round(statistics.median(v[0] for v in values), 1)
        out[f"{name}_env_steps_per_cpu_s"] = round(statistics.median(v[1] for v in values), 1)
    for name in ("m2flow", "m2flow_unnormalized"):
        for unit, j in (("", 0), ("_cpu", 1)):
            pairs = zip(rates[name], rates["gymnasium"])
            out[f"{name}_vs_gymnasium{unit}"] = round(statistics.median(a[j] / b[j] for a, b in pairs), 3)
    return out


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def summarize(runs: list[dict], sides: list[str]) -> dict:
    """Per env and side: median speed, return, checkpoint returns; pairwise speed ratios vs the first side."""
    out: dict = {}
    for env in sorted({r["env"] for r in runs}):
        per = {s: [r for r in runs if r["env"] == env and r["side"] == s] for s in sides}
        entry: dict = {}
        for s, rs in per.items():
            if not rs:
                continue
            cps = sorted({c for r in rs for c in r["checkpoints"]}, key=int)
            entry[s] = {
                "env_steps_per_s": _median([r["env_steps_per_s"] for r in rs]),
                "update_frac": _median([r["update_frac"] for r in rs]),
                "mean_return": _median([r["mean_return"] for r in rs]),
                "checkpoint_returns": {c: _median([r["checkpoints"].get(c) for r in rs]) for c in cps},
                "runs": len(rs),
            }
        base = sides[0]
        for s in sides[1:]:
            pairs = zip(per[base], per[s])
            ratios = [b["env_steps_per_s"] / a["env_steps_per_s"] for a, b in pairs]
            if ratios and s in entry:
                entry[s][f"speed_vs_{base}"] = round(statistics.median(ratios), 3)
        out[env] = entry
    return out


def parse_threads(spec: str, sides: list[str]) -> dict[str, int]:
    """'1' for every side, or 'sb3=1,cleanrl=2' per side (missing sides get 1)."""
    if "=" not in spec:
        return {s: int(spec) for s in sides}
    table = {k.strip(): int(v) for k, v in (item.split("=") for item in spec.split(","))}
    unknown = set(table) - set(sides)
    if unknown:
        raise SystemExit(f"--threads names sides not being run: {sorted(unknown)}; running: {sides}")
    return {s: table.get(s, 1) for s in sides}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setup", action="store_true", help="create the peer venv and exit")
    p.add_argument("--envs", default="HalfCheetah-v5", help="comma-separated gymnasium ids")
    p.add_argument(
        "--sides", default="", help=f"comma-separated, the first is the baseline (default: all of {list(SIDES)})"
    )
    p.add_argument("--steps", type=int, default=20_000, help="env steps per training run")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, cycled over repeats")
    p.add_argument("--repeats", type=int, default=2, help="A B rounds per env")
    p.add_argument("--threads", default="1", help="torch threads: '1' for all or 'sb3=1,cleanrl=2'")
    p.add_argument("--last-n", type=int, default=20, help="returns averaged over the last N episodes")
    p.add_argument("--checkpoints", default="100000,300000", help="env steps at which returns are noted")
    p.add_argument("--raw-steps", type=int, default=2000, help="vector steps per raw-rate sample (0 skips)")
    p.add_argument("--raw-repeats", type=int, default=5, help="rotations of the raw-rate contenders")
    p.add_argument("--raw-only", action="store_true", help="measure only the raw stepping rate")
    p.add_argument("--timeout", type=float, default=7200, help="seconds allowed per training run")
    p.add_argument("--retries", type=int, default=2,
                   help="reruns of a failed training run (a shared machine can kill one) before skipping it")
    p.add_argument("--reuse", action="store_true",
                   help="keep the finished runs already in --out with the same env, side, seed and steps")
    p.add_argument("--out", default=str(HERE / "results" / "e1_embodied.json"), help="result JSON path")
    p.add_argument("--m2flow-placement", default="env,rollout: 0-1, actor: 0",
                   help="the m2flow side's placement (env, rollout, actor)")
    p.add_argument("--m2flow-side", action="store_true", help=argparse.SUPPRESS)  # one m2flow run, JSON out
    p.add_argument("--m2flow-compile", action="store_true", help=argparse.SUPPRESS)  # ... with actor.compile
    p.add_argument("--env", default="HalfCheetah-v5", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.m2flow_side:
        threads = int(args.threads)
        args.threads = threads
        print(json.dumps(m2flow_side(args)))
        return
    if args.setup:
        setup()
        return
    envs = [e for e in args.envs.split(",") if e]
    seeds = [int(s) for s in args.seeds.split(",")]
    wanted = [s for s in args.sides.split(",") if s] or list(SIDES)
    unknown = [s for s in wanted if s not in SIDES]
    if unknown:
        raise SystemExit(f"unknown sides {unknown}; valid: {list(SIDES)}")
    sides, skipped = [], {}
    for name in wanted:
        reason = SIDES[name].unavailable()
        if reason is None:
            sides.append(name)
        else:
            skipped[name] = reason
            print(f"skipping {name}: {reason}", file=sys.stderr)
    threads = parse_threads(args.threads, sides)

    raw = [raw_step_rates(e, 8, args.raw_steps, args.raw_repeats) for e in envs] if args.raw_steps else []
    runs: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done: dict[tuple, dict] = {}
    if args.reuse and out.is_file():
        for r in json.loads(out.read_text()).get("runs", []):
            done[(r["env"], r["side"], r["seed"], r.get("requested_steps"))] = r
    failures: list[dict] = []

    def write() -> dict:
        # rewritten after every run: a long benchmark stopped early still leaves its finished runs
        summary = summarize(runs, sides) if runs else {}
        record = {
            "benchmark": "E1",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "cpus": os.cpu_count(),
            "threads": threads,
            "m2flow_placement": args.m2flow_placement,
            "skipped_sides": skipped,
            "raw_step": raw,
            "summary": summary,
            "runs": runs,
            "failures": failures,
        }
        out.write_text(json.dumps(record, indent=2) + "\n")
        return summary

    if not args.raw_only:
        for env in envs:
            for r in range(args.repeats):
                seed = seeds[r % len(seeds)]
                for name in sides:  # A B A B: every round runs each side once, in the same order
                    result = done.pop((env, name, seed, args.steps), None)
                    for attempt in range(args.retries + 1):
                        if result is not None:
                            break
                        try:
                            result = run_side(SIDES[name], args, env, seed, threads[name])
                            result["requested_steps"] = args.steps
                        except (RuntimeError, subprocess.TimeoutExpired) as e:
                            failures.append({"env": env, "side": name, "seed": seed, "attempt": attempt,
                                             "error": str(e)[-500:]})
                            print(f"{name} {env} seed {seed} failed (attempt {attempt + 1}):\n{e}", file=sys.stderr)
                            time.sleep(30)
                    if result is not None:
                        runs.append(result)
                        print(json.dumps(result), file=sys.stderr)
                    write()
    print(summary_line(write(), raw, sides))


def summary_line(summary: dict, raw: list[dict], sides: list[str]) -> str:
    parts = []
    for env, entry in summary.items():
        speeds = []
        for s in sides:
            if s in entry:
                e = entry[s]
                ratio = next((f" ({v}x {k[9:]})" for k, v in e.items() if k.startswith("speed_vs_")), "")
                at = "".join(f" @{int(c) // 1000}k {v}" for c, v in e["checkpoint_returns"].items())
                speeds.append(f"{s} {e['env_steps_per_s']:.0f} steps/s ret {e['mean_return']}{at}{ratio}")
        parts.append(f"{env}: " + ", ".join(speeds))
    for r in raw:
        parts.append(
            f"raw {r['env']} x{r['num_envs']}: gymnasium {r['gymnasium_env_steps_per_s']:.0f} steps/s, "
            f"m2flow env {r['m2flow_env_steps_per_s']:.0f} ({r['m2flow_vs_gymnasium']}x), "
            f"unnormalised {r['m2flow_unnormalized_env_steps_per_s']:.0f} ({r['m2flow_unnormalized_vs_gymnasium']}x); "
            f"per CPU-s {r['m2flow_vs_gymnasium_cpu']}x / {r['m2flow_unnormalized_vs_gymnasium_cpu']}x"
        )
    return "E1 | " + " | ".join(parts)


if __name__ == "__main__":
    main()
