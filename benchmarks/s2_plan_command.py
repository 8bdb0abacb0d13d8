"""S2, the command: wall time of ``m2flow plan search`` (start-up included) and of ``search()`` in process.

For each workflow shape (reasoning, embodied, agentic) a profile of an example config is made for
this machine: the template ``m2flow plan profile-template`` writes (machine, config hash), filled
with the points and figures of a profile the S1 benchmark measured on this machine
(``benchmarks/results/s1_*_profile.json``; the agentic one borrows S1's reasoning model holders and
embodied env, the env waiting 95% of its busy time as a tool-calling env does). These are CPU
profiles (``cores`` set), so the search also covers plans on fewer devices (``device_counts``).

Each cell runs, in fresh subprocesses, the command (its wall time) and a process that loads the
same context and times ``search()`` alone. With ``--trees A B`` every cell runs under each source
tree in turn (``PYTHONPATH``), so a before/after comparison shares the machine and its load.

    python benchmarks/s2_plan_command.py [--scales 8 512 4096] [--trees /path/before /path/after]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"

SHAPES = {
    "reasoning": ("examples/reasoning/arithmetic_grpo.yaml", "s1_reasoning_steady_s3_profile.json"),
    "embodied": ("examples/embodied/cartpole_pipelined.yaml", "s1_embodied_steady_profile.json"),
    "agentic": ("examples/agentic/calculator_grpo.yaml", None),
}
"""shape -> (example config, the S1 profile its figures come from)"""
_COPIED = ("device", "link", "driver_split", "process_factor", "oversubscribed", "offload_bandwidth")


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "RAY_AUTH_MODE": "disabled"}


def make_profile(tree: Path, shape: str, out: Path) -> Path:
    """A profile of the shape's example config on this machine, filled from S1's measured profile."""
    config, source = SHAPES[shape]
    subprocess.run([sys.executable, "-m", "m2flow", "plan", "profile-template", str(REPO / config), str(out)],
                   env=_env(tree), check=True, capture_output=True, cwd=REPO)
    profile = json.loads(out.read_text())
    if source is not None:
        measured = json.loads((RESULTS / source).read_text())
        comps = measured["components"]
    else:  # agentic: the reasoning model holders and an env that mostly waits (a tool call)
        measured = json.loads((RESULTS / SHAPES["reasoning"][1]).read_text())
        env = json.loads((RESULTS / SHAPES["embodied"][1]).read_text())["components"]["env"]
        comps = {**measured["components"], "env": {**env, "cpu_share": 0.05}}
    for key in _COPIED:
        if key in measured:
            profile[key] = measured[key]
    for edge in profile["edge_bytes"]:
        profile["edge_bytes"][edge] = measured.get("edge_bytes", {}).get(edge, 1000.0)
    for name in profile["components"]:
        profile["components"][name] = {k: v for k, v in comps[name].items() if k != "fit_error"}
    out.write_text(json.dumps(profile))
    return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(tree: Path, shape: str, profile: Path, devices: int) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``m2flow plan search`` in a fresh process, and its first ranked plan (CPU
    seconds compare on a shared machine, where wall time is mostly waiting for a core)."""
    c0, t0 = _children_cpu(), time.perf_counter()
    # Run from the tree: ``-m`` puts the working directory first on the path, ahead of PYTHONPATH.
    done = subprocess.run([sys.executable, "-m", "m2flow", "plan", "search", str(REPO / SHAPES[shape][0]),
                           "--profile", str(profile), "--devices", str(devices), "--top", "1"],
                          env=_env(tree), capture_output=True, text=True, cwd=tree)
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if done.returncode != 0:
        raise RuntimeError(f"plan search failed under {tree}: {done.stderr[-2000:]}")
    first = next((line for line in done.stdout.splitlines() if line.startswith("1. ")), "")
    use = next((line.strip() for line in done.stdout.splitlines() if line.strip().startswith("use:")), "")
    return seconds, cpu, f"{first} | {use}"


def time_search(tree: Path, shape: str, profile: Path, scales: list[int]) -> dict[int, dict[str, Any]]:
    """``search()`` alone at each device count, timed inside one fresh process (``--inner``)."""
    done = subprocess.run([sys.executable, __file__, "--inner", shape, str(profile), *map(str, scales)],
                          env=_env(tree), capture_output=True, text=True, cwd=REPO, check=True)
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def inner(shape: str, profile: str, scales: list[int]) -> None:
    """Load the context as the command does, then time ``search()`` (CPU and wall) at each device count."""
    from m2flow.autoplan.search_command import _context
    from m2flow.planner.profile_file import load_profile
    from m2flow.planner.search import search

    out = {}
    for devices in scales:
        ctx = _context(REPO / SHAPES[shape][0], [], devices)
        cost = load_profile(profile, ctx.spec.name, ctx.config_hash())
        t0, c0 = time.perf_counter(), time.process_time()
        result = search(ctx.space, cost, ctx.devices, top=1, build_plan=ctx.build)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        best = result.ranked[0]
        out[devices] = {"search_s": wall, "search_cpu_s": cpu, "considered": result.considered,
                        "simulated": result.simulated, "seconds_per_item": best.seconds_per_item,
                        "placement": best.placement[:120], "choice": best.choice.describe()}
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[8, 512, 4096])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--trees", type=Path, nargs="+", default=[REPO],
                        help="source trees to time in turn (PYTHONPATH), e.g. before and after a change")
    parser.add_argument("--out", type=Path, default=RESULTS / "s2_plan_command.json")
    parser.add_argument("--command-only", action="store_true", help="time the command alone, not search() in process")
    parser.add_argument("--inner", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner[0], args.inner[1], [int(n) for n in args.inner[2:]])
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="s2-command-") as work:
        for shape in args.shapes:
            profile = make_profile(args.trees[-1], shape, Path(work) / f"{shape}.json")
            searches = {tree: ({} if args.command_only else time_search(tree, shape, profile, args.scales))
                        for tree in args.trees}
            for devices in args.scales:
                for tree in args.trees:
                    wall, cpu, best = time_command(tree, shape, profile, devices)
                    inside = searches[tree].get(devices, {})
                    row = {"shape": shape, "devices": devices, "tree": str(tree), "command_s": wall,
                           "command_cpu_s": cpu, **inside,
                           "best": best, "load_1min": os.getloadavg()[0]}
                    rows.append(row)
                    timed = (f"search() {inside['search_s']:.2f} s wall {inside['search_cpu_s']:.2f} s CPU "
                             f"({inside['considered']} bounded, {inside['simulated']} simulated), " if inside else "")
                    print(f"{shape:9s} {devices:5d} devices [{tree}]: command {wall:.2f} s wall {cpu:.2f} s CPU, "
                          f"{timed}load {row['load_1min']:.1f}; {best}", flush=True)
                    _write(args.out, rows)  # after every row: a long run interrupted keeps what it measured
    return 0


def _write(out: Path, rows: list[dict[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "s2_plan_command", "machine": os.uname().nodename, "cpus": os.cpu_count(),
                               "command": " ".join(["python", "benchmarks/s2_plan_command.py", *sys.argv[1:]]),
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
