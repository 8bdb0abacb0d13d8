"""S3: RLinf's auto-placement planner and m2flow's planner on the same inputs.

RLinf's auto-placement planner (``toolkits/auto_placement`` of an RLinf checkout; not in its
wheel) runs as it is, in RLinf's venv, through ``peers/rlinf_auto_placement.py`` (its classes
driven as its unit tests drive them). For every scenario of ``s3_scenarios.py`` (the planner's own test inputs, S2's
synthetic workloads at several scales, E2's measured costs) this script

* runs RLinf's planner and ours (``m2flow.planner.search``) on the same numbers, timing both;
* simulates both chosen plans under our simulator: RLinf's as its input states it (split: one
  prompt's group per pipeline step, or two env stages; collocated: whole-batch phases, one
  stage; no fusion) and with the best of our settings on
  its placement (chunk size / stages / fusion: placement alone compared);
* asks RLinf's own cost model for its estimate of its plan and of ours, where ours is a plan it
  can express (collocated, or each component on its own devices in chain order);
* checks each plan against our memory model (RLinf's input has no memory).

    python benchmarks/s3_rlinf_planner.py --rlinf /path/to/RLinf [--rlinf-python PY] [--scales 8 64 512]
    python benchmarks/s3_rlinf_planner.py --rlinf /path/to/RLinf --smoke   # a few seconds

``--rlinf-python`` defaults to ``benchmarks/.venvs/rlinf/bin/python`` (``python
benchmarks/r1_transfer.py --setup`` creates it: RLinf 0.3.0 with its hydra-core, scipy, Ray).
Writes ``benchmarks/results/s3_rlinf_planner.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from s3_scenarios import RLINF_OWN, Scenario, e2_embodied, from_rlinf, s2_embodied, s2_reasoning  # noqa: E402

from m2flow.planner.search import Candidate, Searcher, search  # noqa: E402
from m2flow.planner.setup import SimSetup, build_setup  # noqa: E402
from m2flow.planner.simulate import Simulator  # noqa: E402

RESULTS = HERE / "results"
DRIVER = HERE / "peers" / "rlinf_auto_placement.py"
ROLE = {"env_rollout": "rollout"}
BIG = 1024
"""Above this many devices RLinf's plan is simulated with our settings only (not one group per step)."""


# -- RLinf's answer as our plan ------------------------------------------------------------------
def rlinf_blocks(sc: Scenario, placement: list[list[Any]]) -> list[tuple[tuple[str, ...], int, int]]:
    """Its device ranges as our blocks: roles on the same range share a block; reward rides on rollout's."""
    ranges: dict[tuple[int, int], list[str]] = {}
    for role, lo, hi in placement:
        ranges.setdefault((int(lo), int(hi)), []).append(ROLE.get(role, role))
    blocks = []
    for (lo, hi), names in ranges.items():
        if "rollout" in names and "reward" in sc.space.running:
            names = names + ["reward"]
        blocks.append((tuple(c for c in sc.space.running if c in names), lo, hi - lo + 1))
    return blocks


def _setup(sc: Scenario, blocks, settings: dict[str, Any], fusions: tuple[tuple[str, str], ...]) -> SimSetup:
    sp = sc.space
    where = {c: (lo, n) for comps, lo, n in blocks for c in comps}
    hosts = {c: c for c in sp.running}
    for c, h in fusions:
        if where.get(c) == where.get(h):
            hosts[c] = h
    return build_setup(blocks, hosts, {**sp.settings, **settings}, holders=sp.holders, threads=sp.threads,
                       devices_per_node=sc.devices if sc.cost.cores is not None else None)


def evaluate(sc: Scenario, blocks, settings: dict[str, Any], fusions: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """Our simulator's verdict on one plan given as blocks, plan setting values and the fusions taken."""
    setup = _setup(sc, blocks, settings, fusions)
    _, why = Searcher(sc.space, sc.cost, sc.devices).memory(setup)
    sim = Simulator(sc.space.graph, sc.space.workload, sc.cost)
    res = sim.simulate(setup)
    items = sim.items(setup)
    return {"settings": settings, "fusions": [list(f) for f in fusions], "iteration_s": res.iteration_time, "seconds_per_item": res.iteration_time / items,
            "items": items, "bottleneck": res.bottleneck, "fits": not why, "memory": why}


def best_knobs(sc: Scenario, blocks, with_assumed: bool = True) -> dict[str, Any]:
    """The best of our settings (values of the varied plan settings, fusions) on a fixed placement."""
    sp = sc.space
    names = list(sp.varied)
    extra = set(sc.assumed) if with_assumed else set()
    values = [sorted(set(sp.varied[k]) | (extra if k == sc.setting else set())) for k in names]
    best = None
    for combo in itertools.product(*values):
        for taken in itertools.product((False, True), repeat=len(sp.fusions)):
            fusions = tuple(pair for pair, on in zip(sp.fusions, taken) if on)
            r = evaluate(sc, blocks, dict(zip(names, combo)), fusions)
            if best is None or (r["fits"], -r["seconds_per_item"]) > (best["fits"], -best["seconds_per_item"]):
                best = r
    assert best is not None
    return best


# -- our answer as RLinf's plan ------------------------------------------------------------------
def rlinf_spec(sc: Scenario, cand: Candidate) -> tuple[dict[str, Any] | None, str]:
    """Our plan in the forms RLinf's model can estimate, or None and why not."""
    setup = cand.setup
    assert setup is not None
    n, comps = sc.devices, setup.components
    chain = ["rollout", "inference", "actor"] if sc.kind == "reasoning" else ["env", "rollout", "actor"]
    ranks = {c: comps[c].ranks for c in chain}

    def share(a: str, b: str) -> bool:
        return any(a in k.members and b in k.members for k in setup.classes)

    if all(r == n for r in ranks.values()):
        return {"collocated": True}, ""
    if sc.kind == "reasoning":
        if sum(ranks.values()) == n and not any(share(a, b) for a, b in itertools.combinations(chain, 2)):
            return {"split": [[c, ranks[c]] for c in chain]}, ""
        return None, "RLinf's reasoning plans are collocated or all-disaggregated (it rejects hybrids)"
    if ranks["actor"] == n and ranks["env"] + ranks["rollout"] == n and not share("env", "rollout"):
        return {"split": [["env", ranks["env"]], ["env_rollout", ranks["rollout"]]]}, ""
    return None, "RLinf's embodied plans keep the actor on every GPU"


def run_rlinf(python: str, toolkit: Path, payload: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([python, str(DRIVER), str(toolkit)], input=json.dumps(payload), capture_output=True,
                          text=True, env=env, cwd=str(toolkit))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.exit(f"error: RLinf's planner gave no result (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _fmt_blocks(blocks) -> str:
    return ", ".join(f"{','.join(c)}: {lo}-{lo + n - 1}" if n > 1 else f"{','.join(c)}: {lo}" for c, lo, n in blocks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rlinf", type=Path, required=True, help="an RLinf checkout (with toolkits/auto_placement)")
    p.add_argument("--rlinf-python", default=str(HERE / ".venvs" / "rlinf" / "bin" / "python"))
    p.add_argument("--rlinf-commit", default="", help="the checkout's commit, recorded in the results")
    p.add_argument("--scales", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--e2-devices", type=int, nargs="*", default=[2, 3])
    p.add_argument("--repeats", type=int, default=3, help="planning runs per scenario (median)")
    p.add_argument("--suites", nargs="+", default=["own", "s2", "e2"], choices=["own", "s2", "e2"],
                   help="own: the planner's test inputs; s2: S2's workloads at --scales; e2: E2's costs")
    p.add_argument("--only", nargs="*", default=[], help="keep the scenarios whose name contains one of these")
    p.add_argument("--smoke", action="store_true", help="RLinf's own inputs and S2 at 8 devices, once")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    toolkit = args.rlinf / "toolkits" / "auto_placement"
    if not (toolkit / "auto_placement_worker.py").is_file():
        sys.exit(f"error: {toolkit}/auto_placement_worker.py not found: --rlinf must be an RLinf checkout")
    if not Path(args.rlinf_python).exists():
        sys.exit(f"error: {args.rlinf_python} not found: run `python benchmarks/r1_transfer.py --setup` "
                 "or pass --rlinf-python")
    if args.smoke:
        args.scales, args.repeats, args.e2_devices = [8], 1, [2]
    out = args.out or RESULTS / f"s3_rlinf_planner{'_smoke' if args.smoke else ''}.json"

    scenarios: list[Scenario] = [from_rlinf(name) for name in RLINF_OWN] if "own" in args.suites else []
    for n in args.scales if "s2" in args.suites else []:
        scenarios += [s2_reasoning(v, n, slots) for v in ("long", "short") for slots in ("memory", "batch")]
        scenarios += [s2_embodied("heavy", n), s2_embodied("light", n)]
    e2 = json.loads((RESULTS / "e2_placements.json").read_text())["summary"]
    scenarios += [e2_embodied(e2, n) for n in args.e2_devices] if "e2" in args.suites else []

    if args.only:
        scenarios = [sc for sc in scenarios if any(key in sc.name for key in args.only)]
    ours: list[dict[str, Any]] = []
    for sc in scenarios:  # our planner first: RLinf's model is then asked about our plan too
        times, cpus, result = [], [], None
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            result = search(sc.space, sc.cost, sc.devices, top=1,
                            devices_per_node=sc.devices if sc.cost.cores is not None else 8)
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        assert result is not None
        best = result.ranked[0]
        spec, why = rlinf_spec(sc, best)
        ours.append({"cand": best, "plan_s": sorted(times)[len(times) // 2], "cpu_s": sorted(cpus)[len(cpus) // 2],
                     "collocated": result.collocated, "spec": spec, "not_expressible": why})
    payload = [{**sc.rlinf, "name": f"{sc.name} @{sc.devices}", "repeats": args.repeats,
                "estimate": [o["spec"]] if o["spec"] else []} for sc, o in zip(scenarios, ours)]
    answers = run_rlinf(args.rlinf_python, toolkit, payload)

    rows = []
    for sc, o, a in zip(scenarios, ours, answers):
        cand = o["cand"]
        row: dict[str, Any] = {"scenario": sc.name, "kind": sc.kind, "devices": sc.devices, "notes": sc.notes,
                               "rlinf_plan_s": a.get("plan_s"), "rlinf_cpu_s": a.get("cpu_s"),
                               "ours_plan_s": o["plan_s"], "ours_cpu_s": o["cpu_s"]}
        sim_best = cand.result.iteration_time
        row["ours"] = {"placement": cand.placement, "mode": cand.shape.mode,
                       "settings": cand.choice.values, "fusions": [list(f) for f in cand.choice.fusions],
                       "iteration_s": sim_best, "seconds_per_item": cand.seconds_per_item,
                       "bottleneck": cand.result.bottleneck,
                       "rlinf_estimate_s": (a.get("estimates") or [None])[0], "not_expressible": o["not_expressible"]}
        if o["spec"] and row["ours"]["rlinf_estimate_s"] is None:
            row["ours"]["not_expressible"] = ("RLinf's model has no cost at these GPU counts (its actor and inference "
                                              "counts must divide the training batch into whole groups)")
        coll = o["collocated"]
        row["collocated_s_per_item"] = coll.seconds_per_item if coll is not None else math.nan
        if not a.get("found"):
            row["rlinf"] = {"found": False, "error": a.get("error", "no valid placement")}
        else:
            blocks = rlinf_blocks(sc, a["placement"])
            split = any(n < sc.devices for _, _, n in blocks)
            # One prompt's group per pipeline step is thousands of simulated calls on thousands of devices.
            small = sc.devices <= BIG
            assumed = evaluate(sc, blocks, sc.as_assumed(split)) if small else None
            tuned = best_knobs(sc, blocks, with_assumed=small)
            row["rlinf"] = {"found": True, "printed": a["printed"], "mode": a["mode"], "hybrid": a["hybrid"],
                            "placement": _fmt_blocks(blocks), "estimate_s": a["estimate_s"],
                            "as_assumed": assumed, "best_knobs": tuned}
        rows.append(row)
        _print(row)
    summary = _summary(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(toolkit.glob("*.py")))).hexdigest()[:16]
    out.write_text(json.dumps({"benchmark": "s3_rlinf_planner", "python": platform.python_version(),
                               "rlinf_toolkit_sha256": digest, "rlinf_commit": args.rlinf_commit,
                               "machine": platform.node(), "load_1min": os.getloadavg()[0], "rows": rows,
                               "summary": summary}, indent=1, default=str))
    print(summary)
    return 0


def _print(r: dict[str, Any]) -> None:
    o, rl = r["ours"], r["rlinf"]
    head = f"{r['scenario']} @{r['devices']}:"
    if not rl["found"]:
        print(f"{head} RLinf found no plan ({rl['error']}); ours {o['placement']} {o['iteration_s']:.3f} s")
        return
    ratio = rl["best_knobs"]["seconds_per_item"] / o["seconds_per_item"]
    est = f"n/a: {o['not_expressible']}" if o["rlinf_estimate_s"] is None else f"{o['rlinf_estimate_s']:.3f} s"
    assumed = rl["as_assumed"]
    as_assumed = ("" if assumed is None else f" {assumed['iteration_s']:.3f} s as assumed"
                  f"{'' if assumed['fits'] else ' (DOES NOT FIT)'},")
    mode = "hybrid" if rl["hybrid"] else rl["mode"]
    print(f"{head} RLinf {rl['placement']!r} ({mode}) estimate {rl['estimate_s']:.3f} s, simulated"
          f"{as_assumed} {rl['best_knobs']['iteration_s']:.3f} s with our best settings"
          f"{'' if rl['best_knobs']['fits'] else ' (DOES NOT FIT)'} | ours {o['placement']!r} "
          f"{o['iteration_s']:.3f} s (RLinf's estimate {est}) | RLinf/ours {ratio:.2f}x | plan "
          f"{r['rlinf_cpu_s']:.3f} s vs {r['ours_cpu_s']:.3f} s CPU", flush=True)


def _summary(rows: list[dict[str, Any]]) -> str:
    done = [r for r in rows if r["rlinf"]["found"]]
    ratios = [r["rlinf"]["best_knobs"]["seconds_per_item"] / r["ours"]["seconds_per_item"] for r in done]
    unfit = sum(not r["rlinf"]["best_knobs"]["fits"] for r in done)
    return (f"S3: {len(rows)} scenarios, RLinf found a plan in {len(done)}; its plan simulated (best settings) "
            f"{min(ratios):.2f}-{max(ratios):.2f}x our plan's seconds per item; {unfit} of its plans exceed "
            f"device memory")


if __name__ == "__main__":
    sys.exit(main())
