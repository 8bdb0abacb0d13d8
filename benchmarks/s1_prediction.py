"""Benchmark S1: the planner's predicted iteration time against the measured one, for every plan that fits.

For one workload (``embodied``: E2's, HalfCheetah-v5 PPO, 8 envs x 256 steps per iteration;
``reasoning``: G1's, GRPO on a tiny Qwen2, 8 prompts x 4 samples x 16 tokens, lean backend):

1. profile it on this machine through the real workers (``m2flow profile``'s ``Profiler``), or
   reuse ``--profile FILE``;
2. search every plan of the config's search space (``m2flow plan search``'s ``search``): each
   candidate that fits, with its predicted iteration time (``--max-plans`` keeps the fastest ones);
3. run each candidate as the config it stands for (the candidate's overrides applied, exactly what
   ``placement: auto`` would run), each run in a fresh process, plans in rotation for ``--rounds``
   rounds; a run's time is the median wall time of its iterations after the first, a plan's the
   least of its runs (the machine's slow spells hit whole runs; the median over rounds is reported
   beside it); the share of CPU time the hypervisor took (steal, ``/proc/stat``) is recorded per run;
4. report per plan predicted vs measured and the error, the median
   absolute error (goal <= 5%), Kendall's tau between the predicted and the measured order (goal
   >= 0.8), the chosen plan's measured time against the best measured plan (goal within 5%), and how
   noisy the measurement was (the spread of each plan's runs over rounds).

    python benchmarks/s1_prediction.py embodied [--rounds 4] [--iterations 6] [--profile FILE]
    python benchmarks/s1_prediction.py reasoning --iterations 20 --max-plans 14

Writes ``benchmarks/results/s1_<workflow>.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import itertools
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two orders of the same items (ties count as neither agreement nor disagreement)."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    if not pairs:
        return float("nan")
    score = sum((1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1) for i, j in pairs if a[i] != a[j] and b[i] != b[j])
    return score / len(pairs)


def cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``, in ticks; None where there is none)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def stolen_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Of the CPU time this machine wanted between two readings, the share its hypervisor ran
    something else instead (*steal*): a virtual machine's slow spells that no plan causes."""
    if before is None or after is None:
        return None
    d = [b - a for a, b in zip(before, after)]
    user, nice, system, _idle, _iowait, irq, softirq, steal = d
    wanted = user + nice + system + irq + softirq + steal
    return round(steal / wanted, 4) if wanted > 0 else 0.0


def _pct(values: list[float], q: float) -> str:
    """The ``q`` quantile of sorted ``values`` as a percentage ("n/a" without any)."""
    return f"{values[min(len(values) - 1, int(q * len(values)))]:.1%}" if values else "n/a"


def base_config(workflow: str, workdir: Path, iterations: int, seed: int) -> Any:
    """The workload's config before any plan is chosen (``placement: all``: the search starts there)."""
    from m2flow.config import from_dict

    if workflow == "embodied":
        from m2flow.workflows.embodied.config import EmbodiedConfig

        return from_dict(EmbodiedConfig, {
            "placement": "all", "env": {"env_id": "HalfCheetah-v5", "num_envs": 8}, "rollout_steps": 256,
            "total_env_steps": iterations * 2048, "seed": seed, "run_dir": str(workdir / "run"),
            "metrics": {"sinks": []}, "eval_every": 0})
    if workflow == "reasoning":
        from g1_reasoning import RunnerPlan, make_workload, runner_config

        args = argparse.Namespace(seed=seed, prompts=8, group=4, max_new_tokens=16, steps=iterations - 1, warmup=1)
        w = json.loads(make_workload(args, workdir).read_text())
        # G1's config (reward scored in process, no KL, the actor's own old log-probs) with G1's best
        # thread setting, 2 torch threads per busy worker; the cost model prices what sharing the two
        # cores between processes costs.
        return runner_config(w, 2, RunnerPlan("all"), str(workdir / "run"), backend="lean")
    raise SystemExit(f"unknown workflow {workflow!r}; valid: ['embodied', 'reasoning']")


def spec_of(workflow: str) -> Any:
    from m2flow.driver.registry import get_workflow

    return get_workflow(workflow)


def profile(ctx: Any, path: Path, iterations: int, repeats: int) -> None:
    from m2flow.autoplan.profiler import Profiler

    with tempfile.TemporaryDirectory(prefix="s1-profile-") as work:
        Profiler(ctx, iterations=iterations, work_dir=Path(work), say=lambda s: print(s, file=sys.stderr),
                 repeats=repeats).run(path)


def candidates(ctx: Any, cost: Any) -> tuple[list[dict[str, Any]], list[dict[str, str]], Any]:
    """Every plan of the space that fits, fastest predicted first; the rejected ones; the search result."""
    from m2flow.planner.search import search
    from m2flow.autoplan.auto_choice import Choice

    result = search(ctx.space, cost, ctx.devices, top=10_000, plan_fn=ctx.spec.plan, configure=ctx.configure,
                    layout=ctx.layout)
    rows, seen = [], set()
    for cand in result.ranked:
        # What placement: auto would run for this candidate (a one-device plan on the local executor).
        choice = Choice(ctx, cost, cand)
        key = json.dumps(choice.overrides, sort_keys=True)
        if key in seen:  # the same config reached through two shapes
            continue
        seen.add(key)
        rows.append({"overrides": choice.overrides, "config": choice.cfg, "mode": cand.shape.mode,
                     "devices": len(set().union(*(c.placement.devices for c in cand.plan.components))),
                     "items": cand.items, "predicted_s": cand.result.iteration_time,
                     "bottleneck": cand.result.bottleneck})
    rows.sort(key=lambda r: r["predicted_s"] / r["items"])
    rejected = [{"placement": c.placement, "why": c.rejected} for c in result.rejected]
    return rows, rejected, result


def run_one(workflow: str, config_json: str, skip: int) -> dict[str, Any]:
    """Train the config in this process; the wall seconds of each iteration after the first ``skip``."""
    from m2flow.config import from_dict
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.profiler import ITERATION_KEYS  # an iteration's wall seconds (reasoning, embodied)

    setup_logging(console=False)
    spec = spec_of(workflow)
    cfg = from_dict(spec.schema, json.loads(config_json))
    result = spec.auto.train(cfg, None, None)
    key = next(k for k in ITERATION_KEYS if k in result.history[0])
    return {"iterations": [h[key] for h in result.history[skip:]], "mode": result.mode}


def measure(workflow: str, cfg: Any, skip: int, timeout: float) -> dict[str, Any]:
    """One run of ``cfg`` in a fresh process (a run directory of its own); its iteration times."""
    from m2flow.config.convert import to_dict

    with tempfile.TemporaryDirectory(prefix="s1-run-") as tmp:
        data = to_dict(cfg)
        data["run_dir"] = str(Path(tmp) / "run")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(HERE),
                                                                        os.environ.get("PYTHONPATH")])),
                   TOKENIZERS_PARALLELISM="false")
        cmd = [sys.executable, str(Path(__file__).resolve()), workflow, "--one", json.dumps(data), "--skip", str(skip)]
        load = os.getloadavg()[0]
        for attempt in range(3):  # a loaded machine can time Ray's start-up out
            before = cpu_times()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode == 0 and lines:
                out = json.loads(lines[-1])
                out["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
                out["steal"] = stolen_share(before, cpu_times())
                return out
            print(f"run failed (attempt {attempt + 1}, exit {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
            time.sleep(10)
    raise RuntimeError(f"{workflow}: a plan failed 3 times: {json.dumps(data.get('placement'))}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workflow", choices=["embodied", "reasoning"])
    p.add_argument("--iterations", type=int, default=6, help="iterations per measured run (the first is not counted)")
    p.add_argument("--rounds", type=int, default=4,
                   help="rotations over the plans (at least 2 to see the noise; the least of 4 runs is steadier than of 2)")
    p.add_argument("--profile", type=Path, default=None, help="reuse this profile instead of profiling first")
    p.add_argument("--profile-iterations", type=int, default=6, help="iterations of each profiling probe")
    p.add_argument("--profile-repeats", type=int, default=2,
                   help="runs of each probe, in rotation; the fastest counts (m2flow profile --repeats)")
    p.add_argument("--slots", type=int, default=os.cpu_count(),
                   help="measure plans on at most this many device slots (default: the cores; a plan on more "
                        "slots than cores only adds processes that wait for a core)")
    p.add_argument("--within", type=float, default=4.0,
                   help="measure plans predicted at most this many times slower than the best (0: all)")
    p.add_argument("--max-plans", type=int, default=0, help="then at most the N fastest predicted (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: results/s1_<workflow>.json)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # run one config here, JSON out
    p.add_argument("--skip", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.workflow, args.one, args.skip)))
        return 0
    if args.rounds < 1 or args.iterations < 2:
        raise SystemExit("--rounds must be >= 1 and --iterations >= 2 (the first iteration is not counted)")
    out = args.out or HERE / "results" / f"s1_{args.workflow}.json"

    from m2flow.planner.profile import load_profile
    from m2flow.autoplan.plan_context import PlanContext

    with tempfile.TemporaryDirectory(prefix="s1-") as work:
        work_dir = Path(work)
        cfg = base_config(args.workflow, work_dir, args.iterations, args.seed)
        spec = spec_of(args.workflow)
        ctx = PlanContext(spec, cfg)
        profile_file = args.profile
        t0 = time.perf_counter()
        if profile_file is None:
            profile_file = out.with_name(out.stem + "_profile.json")
            profile(ctx, profile_file, args.profile_iterations, args.profile_repeats)
        profile_s = time.perf_counter() - t0
        cost = load_profile(profile_file, spec.name, ctx.config_hash())
        t0 = time.perf_counter()
        rows, rejected, _ = candidates(ctx, cost)
        plan_s = time.perf_counter() - t0
        fitting = len(rows)
        rows = [r for r in rows if r["devices"] <= args.slots]
        on_slots = len(rows)
        if args.within and rows:
            fastest = rows[0]["predicted_s"] / rows[0]["items"]
            rows = [r for r in rows if r["predicted_s"] / r["items"] <= args.within * fastest]
        if args.max_plans:
            rows = rows[:args.max_plans]
        print(f"S1 {args.workflow}: {fitting} plan(s) fit ({len(rejected)} rejected), {on_slots} on at most "
              f"{args.slots} device slot(s), {len(rows)} to measure; profiling took {profile_s:.0f} s, "
              f"planning {plan_s:.2f} s", file=sys.stderr)
        for rnd in range(args.rounds):
            for i, row in enumerate(rows):
                got = measure(args.workflow, row["config"], 1, args.timeout)
                row.setdefault("runs", []).append(statistics.median(got["iterations"]))
                row.setdefault("iteration_s", []).append([round(t, 4) for t in got["iterations"]])
                row.setdefault("loads", []).extend(got["load"])
                row.setdefault("steal", []).append(got["steal"])
                row["measured_mode"] = got["mode"]
                print(f"round {rnd + 1} plan {i + 1}/{len(rows)} {json.dumps(row['overrides'])}: predicted "
                      f"{row['predicted_s']:.3f} s, measured {row['runs'][-1]:.3f} s", file=sys.stderr)
    for row in rows:
        del row["config"]
        # A plan's time: the least of its runs' medians. The machine has slow spells of seconds (up to
        # 1.5x) that hit whole runs at random; the least is the plan on the machine without one, the same
        # statistic the profile keeps of its repeated probes. The median over rounds is reported beside.
        row["measured_s"] = min(row["runs"])
        row["median_measured_s"] = statistics.median(row["runs"])
        row["error"] = row["predicted_s"] / row["measured_s"] - 1
        row["median_error"] = row["predicted_s"] / row["median_measured_s"] - 1
        row["round_spread"] = max(row["runs"]) / min(row["runs"])
    stats = {}
    for key, err in (("measured_s", "error"), ("median_measured_s", "median_error")):
        # Plans are ranked by seconds per item (the search's order; items per iteration can differ by plan).
        tau = kendall_tau([r["predicted_s"] / r["items"] for r in rows], [r[key] / r["items"] for r in rows])
        best = min(rows, key=lambda r: r[key] / r["items"])
        chosen = rows[0]  # the search's best: what placement: auto runs
        stats[key] = {"median_abs_error": statistics.median(abs(r[err]) for r in rows), "kendall_tau": tau,
                      "best_measured": best["overrides"],
                      "chosen_over_best": (chosen[key] / chosen["items"]) / (best[key] / best["items"])}
    head, med = stats["measured_s"], stats["median_measured_s"]
    chosen = rows[0]
    # Noise: the same order measured in one round against another (how far the measurement agrees with itself).
    round_taus = [kendall_tau([r["runs"][a] / r["items"] for r in rows], [r["runs"][b] / r["items"] for r in rows])
                  for a, b in itertools.combinations(range(args.rounds), 2)]
    steal = sorted(x for r in rows for x in r["steal"] if x is not None)
    summary = (f"S1 {args.workflow}: {len(rows)} plans, median |error| {head['median_abs_error']:.1%}, "
               f"Kendall tau {head['kendall_tau']:.2f}, chosen plan {head['chosen_over_best'] - 1:+.1%} per item "
               f"from the best measured (least of {args.rounds} runs); over the median run: "
               f"{med['median_abs_error']:.1%}, tau {med['kendall_tau']:.2f}, chosen {med['chosen_over_best'] - 1:+.1%}; "
               f"round-to-round spread median {statistics.median(r['round_spread'] for r in rows):.2f}x, "
               f"tau between rounds median {statistics.median(round_taus) if round_taus else float('nan'):.2f}; "
               f"CPU time stolen by the hypervisor per run: median {_pct(steal, 0.5)}, most {_pct(steal, 1.0)}")
    record = {"benchmark": "S1", "workflow": args.workflow,
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpus": os.cpu_count(),
              "profile": str(profile_file), "profile_s": profile_s, "planning_s": plan_s,
              "plans_fitting": fitting, "plans_on_slots": on_slots, "slots": args.slots, "within": args.within,
              "iterations": args.iterations, "rounds": args.rounds, "plans": rows, "rejected": rejected,
              "median_abs_error": head["median_abs_error"], "kendall_tau": head["kendall_tau"],
              "round_kendall_taus": round_taus, "chosen": chosen["overrides"], "best_measured": head["best_measured"],
              "chosen_over_best": head["chosen_over_best"], "over_median_runs": med,
              "steal_median": statistics.median(steal) if steal else None, "summary": summary}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
