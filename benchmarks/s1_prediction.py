"""Benchmark S1: the planner's predicted iteration time against the measured one, for every plan that fits.

For one workload (``embodied``: E2's, HalfCheetah-v5 PPO, 8 envs x 256 steps per iteration;
``reasoning``: G1's, GRPO on a tiny Qwen2, 8 prompts x 4 samples x 16 tokens, lean backend):

1. profile it on this machine through the real workers (``m2flow profile``'s ``Profiler``), or
   reuse ``--profile FILE``;
2. search every plan of the config's search space (``m2flow plan search``'s ``search``): each
   candidate that fits, with its predicted iteration time (``--max-plans`` keeps the fastest ones);
3. run each candidate as the config it stands for (the candidate's overrides applied, exactly what
   ``placement: auto`` would run), each run in a fresh process, plans interleaved for ``--rounds``
   rounds (every round visits every plan, odd rounds in reverse order, so a slow drift of the machine
   weighs on all plans alike). A run times ``--iterations`` iterations after ``--warmup`` untimed ones,
   or fewer where that many take ``--min-seconds`` (by the prediction); its time is the median of
   its iterations, a plan's the median of its runs;
4. a load check around every run: before it, wait (up to ``--max-wait`` s) until the 1-minute load
   average (``/proc/loadavg``) is at most ``--max-load`` and the machine is idle (others' CPU use
   over 2 s, ``/proc/stat``, at most ``--max-busy`` of it); right after it, look again: a run whose
   machine was busy with something else is discarded and run again (up to ``--retries`` times),
   and the discarded runs are counted. The share of CPU time the hypervisor took (steal) is
   recorded per run;
5. report per plan predicted vs measured and the error, the median absolute error (goal <= 5%),
   Kendall's tau between the predicted and the measured order (goal >= 0.8), the chosen plan's
   measured time against the best measured plan (goal within 5%), and beside them the
   measurement's own noise: each plan's spread (max/min of its runs) and the tau between rounds.

    python benchmarks/s1_prediction.py embodied [--rounds 4] [--iterations 20] [--profile FILE]
    python benchmarks/s1_prediction.py reasoning --max-plans 14

Writes ``benchmarks/results/s1_<workflow>.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
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


def machine_busy(seconds: float = 2.0) -> float | None:
    """The share of the machine's CPU time spent busy over the next ``seconds`` (None without /proc/stat);
    sampled while this harness runs nothing, it is the others' use."""
    before = cpu_times()
    time.sleep(seconds)
    after = cpu_times()
    if before is None or after is None:
        return None
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    return (total - d[3] - d[4]) / total if total > 0 else 0.0  # all but idle and iowait


def wait_quiet(max_load: float, max_busy: float, max_wait: float) -> dict[str, Any]:
    """Wait until the 1-minute load average and the machine's busy share are low (at most ``max_wait`` s)."""
    t0 = time.perf_counter()
    while True:
        load, busy = os.getloadavg()[0], machine_busy()
        quiet = load <= max_load and (busy is None or busy <= max_busy)
        if quiet or time.perf_counter() - t0 >= max_wait:
            return {"waited_s": round(time.perf_counter() - t0, 1), "load_before": round(load, 2),
                    "busy_before": busy, "quiet_before": quiet}
        time.sleep(5)


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
    from m2flow.autoplan.probes import Profiler

    with tempfile.TemporaryDirectory(prefix="s1-profile-") as work:
        Profiler(ctx, iterations=iterations, work_dir=Path(work), say=lambda s: print(s, file=sys.stderr),
                 repeats=repeats).run(path)


def candidates(ctx: Any, cost: Any) -> tuple[list[dict[str, Any]], list[dict[str, str]], Any]:
    """Every plan of the space that fits, fastest predicted first; the rejected ones; the search result."""
    from m2flow.planner.search import search
    from m2flow.autoplan.selection import Choice

    result = search(ctx.space, cost, ctx.devices, top=10_000, build_plan=ctx.build)
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
    rejected += [{"reason": kind, "count": n} for kind, n in result.reasons.items()]
    return rows, rejected, result


def run_one(workflow: str, config_json: str, skip: int) -> dict[str, Any]:
    """Train the config in this process; the wall seconds of each iteration after the first ``skip``."""
    from m2flow.config import from_dict
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.probes import ITERATION_KEYS  # an iteration's wall seconds (reasoning, embodied)

    setup_logging(console=False)
    spec = spec_of(workflow)
    cfg = from_dict(spec.schema, json.loads(config_json))
    from m2flow.autoplan.entry import train

    result = train(spec, cfg)
    key = next(k for k in ITERATION_KEYS if k in result.history[0])
    return {"iterations": [h[key] for h in result.history[skip:]], "mode": result.mode}


def measure(workflow: str, cfg: Any, skip: int, timeout: float) -> dict[str, Any]:
    """One run of ``cfg`` in a fresh process (a run directory of its own); its iteration times after ``skip``."""
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


def measure_quietly(workflow: str, cfg: Any, skip: int, args: argparse.Namespace) -> dict[str, Any]:
    """``measure`` between two load checks; a run the machine's other work disturbed is run again (at most
    ``args.retries`` times). The result says how many runs were discarded and why."""
    discarded = []
    for attempt in range(args.retries + 1):
        before = wait_quiet(args.max_load, args.max_busy, args.max_wait)
        got = measure(workflow, cfg, skip, args.timeout)
        time.sleep(3)  # the run's own processes (Ray's daemons) end within a second or two of it
        after = machine_busy()
        load_after = os.getloadavg()[0]
        disturbed = not before["quiet_before"] or (after is not None and after > args.max_busy)
        got.update(before, busy_after=after, load_after=round(load_after, 2), disturbed=disturbed)
        if not disturbed or attempt == args.retries:
            got["discarded"] = discarded
            return got
        discarded.append({k: got[k] for k in ("load_before", "busy_before", "busy_after", "load_after")})
        print(f"  disturbed run discarded (load {before['load_before']}, others busy {before['busy_before']} "
              f"before, {after} after); again", file=sys.stderr)
    raise AssertionError("unreachable")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workflow", choices=["embodied", "reasoning"])
    p.add_argument("--iterations", type=int, default=20, help="timed iterations per run (after the warm-up)")
    p.add_argument("--min-seconds", type=float, default=10.0,
                   help="...or fewer (at least 3, or --iterations if fewer), where that many take this many "
                        "seconds by the plan's prediction")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations at the start of every run")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds over the plans (at least 2 to see the noise)")
    p.add_argument("--max-load", type=float, default=0.8 * (os.cpu_count() or 1),
                   help="start a run only below this 1-minute load average (default: 0.8 per core)")
    p.add_argument("--max-busy", type=float, default=0.15,
                   help="the machine counts as quiet while others use at most this share of its CPU time")
    p.add_argument("--max-wait", type=float, default=600, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--retries", type=int, default=3, help="runs again after a disturbed one (then kept, flagged)")
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
    if args.rounds < 1 or args.iterations < 1 or args.warmup < 1:
        raise SystemExit("--rounds, --iterations and --warmup must be >= 1 (the first iteration is never timed)")
    out = args.out or HERE / "results" / f"s1_{args.workflow}.json"

    from m2flow.planner.profile_file import load_profile
    from m2flow.autoplan.plan_context import PlanContext

    with tempfile.TemporaryDirectory(prefix="s1-") as work:
        work_dir = Path(work)
        cfg = base_config(args.workflow, work_dir, args.warmup + args.iterations, args.seed)
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
        rows, rejected, result = candidates(ctx, cost)
        plan_s = time.perf_counter() - t0
        fitting = len(rows)
        rows = [r for r in rows if r["devices"] <= args.slots]
        on_slots = len(rows)
        if args.within and rows:
            fastest = rows[0]["predicted_s"] / rows[0]["items"]
            rows = [r for r in rows if r["predicted_s"] / r["items"] <= args.within * fastest]
        if args.max_plans:
            rows = rows[:args.max_plans]
        print(f"S1 {args.workflow}: {fitting} plan(s) fit ({sum(result.reasons.values())} rejected), {on_slots} on at most "
              f"{args.slots} device slot(s), {len(rows)} to measure; profiling took {profile_s:.0f} s, "
              f"planning {plan_s:.2f} s", file=sys.stderr)
        from m2flow.config import with_overrides

        for row in rows:  # each plan times enough iterations: --iterations, or --min-seconds of them
            enough = math.ceil(args.min_seconds / max(row["predicted_s"], 1e-9))
            timed = max(min(3, args.iterations), min(args.iterations, enough))
            row["timed_iterations"] = timed
            row["config"] = with_overrides(spec.schema, row["config"],
                                           spec.profile_length(row["config"], args.warmup + timed))
        discarded = 0
        for rnd in range(args.rounds):
            order = list(enumerate(rows))
            for i, row in (order if rnd % 2 == 0 else order[::-1]):
                got = measure_quietly(args.workflow, row["config"], args.warmup, args)
                discarded += len(got["discarded"])
                row.setdefault("runs", []).append(statistics.median(got["iterations"]))
                row.setdefault("iteration_s", []).append([round(t, 4) for t in got["iterations"]])
                row.setdefault("timed_s", []).append(round(sum(got["iterations"]), 2))
                row.setdefault("loads", []).extend(got["load"])
                row.setdefault("steal", []).append(got["steal"])
                row.setdefault("checks", []).append({k: got[k] for k in ("waited_s", "load_before", "busy_before",
                                                                          "busy_after", "load_after", "disturbed")})
                row.setdefault("discarded", []).extend(got["discarded"])
                row["measured_mode"] = got["mode"]
                print(f"round {rnd + 1} plan {i + 1}/{len(rows)} {json.dumps(row['overrides'])}: predicted "
                      f"{row['predicted_s']:.3f} s, measured {row['runs'][-1]:.3f} s", file=sys.stderr)
    for row in rows:
        del row["config"]
        # A plan's time: the median of its runs (each the median of its iterations), on runs the load
        # check let through. The least of the runs is kept beside it.
        row["measured_s"] = statistics.median(row["runs"])
        row["least_measured_s"] = min(row["runs"])
        row["error"] = row["predicted_s"] / row["measured_s"] - 1
        row["least_error"] = row["predicted_s"] / row["least_measured_s"] - 1
        row["round_spread"] = max(row["runs"]) / min(row["runs"])
    stats = {}
    for key, err in (("measured_s", "error"), ("least_measured_s", "least_error")):
        # Plans are ranked by seconds per item (the search's order; items per iteration can differ by plan).
        tau = kendall_tau([r["predicted_s"] / r["items"] for r in rows], [r[key] / r["items"] for r in rows])
        best = min(rows, key=lambda r: r[key] / r["items"])
        chosen = rows[0]  # the search's best: what placement: auto runs
        stats[key] = {"median_abs_error": statistics.median(abs(r[err]) for r in rows), "kendall_tau": tau,
                      "best_measured": best["overrides"],
                      "chosen_over_best": (chosen[key] / chosen["items"]) / (best[key] / best["items"])}
    head, least = stats["measured_s"], stats["least_measured_s"]
    chosen = rows[0]
    # Noise: the same order measured in one round against another (how far the measurement agrees with itself).
    round_taus = [kendall_tau([r["runs"][a] / r["items"] for r in rows], [r["runs"][b] / r["items"] for r in rows])
                  for a, b in itertools.combinations(range(args.rounds), 2)]
    steal = sorted(x for r in rows for x in r["steal"] if x is not None)
    spreads = [r["round_spread"] for r in rows]
    flagged = sum(c["disturbed"] for r in rows for c in r["checks"])
    summary = (f"S1 {args.workflow}: {len(rows)} plans, median |error| {head['median_abs_error']:.1%}, "
               f"Kendall tau {head['kendall_tau']:.2f}, chosen plan {head['chosen_over_best'] - 1:+.1%} per item "
               f"from the best measured (median of {args.rounds} runs); the measurement itself: a plan's runs "
               f"spread median {statistics.median(spreads):.2f}x, most {max(spreads):.2f}x, tau between rounds "
               f"median {statistics.median(round_taus) if round_taus else float('nan'):.2f}; load check: "
               f"{discarded} disturbed run(s) discarded, {flagged} kept flagged; least of the runs: "
               f"{least['median_abs_error']:.1%}, tau {least['kendall_tau']:.2f}; "
               f"CPU time stolen by the hypervisor per run: median {_pct(steal, 0.5)}, most {_pct(steal, 1.0)}")
    record = {"benchmark": "S1", "workflow": args.workflow,
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpus": os.cpu_count(),
              "profile": str(profile_file), "profile_s": profile_s, "planning_s": plan_s,
              "plans_fitting": fitting, "plans_on_slots": on_slots, "slots": args.slots, "within": args.within,
              "iterations": args.iterations, "warmup": args.warmup, "min_seconds": args.min_seconds,
              "rounds": args.rounds, "max_load": args.max_load, "max_busy": args.max_busy,
              "discarded_runs": discarded, "flagged_runs": flagged,
              "round_spread_median": statistics.median(spreads), "round_spread_max": max(spreads),
              "plans": rows, "rejected": rejected,
              "median_abs_error": head["median_abs_error"], "kendall_tau": head["kendall_tau"],
              "round_kendall_taus": round_taus, "chosen": chosen["overrides"], "best_measured": head["best_measured"],
              "chosen_over_best": head["chosen_over_best"], "over_least_runs": least,
              "steal_median": statistics.median(steal) if steal else None, "summary": summary}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
