"""Whether this checkout and an earlier commit do the same work per iteration of E1: call counts per function.

A timing A/B on a shared two-core machine cannot resolve a few percent (see ``ab_code.py``); the work
itself can be compared exactly. This script runs E1's m2flow side (``e1_embodied.py --sides m2flow``,
each checkout's own script) with every process of the run profiled: the driver and each Ray worker
count the calls of every Python function in all its threads (``cProfile``), through a
``sitecustomize`` module put on the run's ``PYTHONPATH``. The counts are read when the driver kills
its first worker group, which follows the last iteration. Each checkout runs at two lengths; the
difference of the two runs, divided by the difference in iterations, is the work of one iteration,
with start-up (imports, model building) cancelled out. Functions whose per-iteration counts differ
between the checkouts are listed by process kind; timing-dependent ones (polls, waits) differ by a
little in any two runs, the work of an iteration does not.

    python benchmarks/ab_calls.py --ref ebb796a

Writes ``benchmarks/results/ab_calls_<ref>.json`` and prints the differences.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab_code import HERE, ROOT, worktree

PROBE = r'''
import os, sys
_DIR = os.environ.get("M2FLOW_CALLS_DIR")
try:
    _CMD = open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
except OSError:
    _CMD = ""
if _DIR and ("default_worker.py" in _CMD or "--m2flow-side" in _CMD):
    import cProfile, json, threading, time
    _STOP = os.path.join(_DIR, "STOP")
    _profilers = []

    def _profile_thread(*_):
        if threading.current_thread().name.startswith("calls-"):
            sys.setprofile(None)
            return
        p = cProfile.Profile()
        _profilers.append(p)
        p.enable()

    threading.setprofile(_profile_thread)
    _main = cProfile.Profile()
    _profilers.append(_main)
    _main.enable()

    def _dump():
        while not os.path.exists(_STOP):
            time.sleep(0.01)
        counts = {}
        for p in list(_profilers):
            for e in p.getstats():
                c = e.code
                key = c if isinstance(c, str) else f"{c.co_filename}:{c.co_name}"  # no line: code moves
                counts[key] = counts.get(key, 0) + e.callcount
        title = open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
        path = os.path.join(_DIR, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"title": "driver" if "--m2flow-side" in _CMD else title, "counts": counts}, f)
        os.replace(path + ".tmp", path)

    threading.Thread(target=_dump, daemon=True, name="calls-dump").start()

    if "--m2flow-side" in _CMD:
        def _hook_kill():
            while getattr(sys.modules.get("ray"), "kill", None) is None:
                time.sleep(0.05)
            ray = sys.modules["ray"]
            kill = ray.kill

            def kill_after_counts(*args, **kwargs):
                if not os.path.exists(_STOP):  # the loop is over: every process writes its counts first
                    open(_STOP, "w").close()
                    time.sleep(2.0)
                return kill(*args, **kwargs)

            ray.kill = kill_after_counts

        threading.Thread(target=_hook_kill, daemon=True, name="calls-hook").start()
'''

BENCH_ARGS = ["--sides", "m2flow", "--repeats", "1", "--raw-steps", "0"]
STEPS_PER_ITERATION = 2048  # E1's m2flow side: 8 envs x 256 steps


def _normalize(key: str) -> str:
    """A function's name without what differs between checkouts and processes (paths, addresses)."""
    key = re.sub(r".*/(m2flow/|site-packages/|lib/python3\.\d+/)", r"\1", key)
    key = re.sub(r"<built-in method (\S+) of .* at 0x[0-9a-f]+>", r"<built-in method \1>", key)
    return re.sub(r" at 0x[0-9a-f]+", "", key)


def _kind(title: str) -> str:
    """The process kind of a title such as ``ray::env-1a2b3c4d[0].interact``: ``env[0]``."""
    name = re.sub(r"-[0-9a-f]{8}", "", title.removeprefix("ray::")).split(".")[0]
    return name if name == "driver" or "[" in name else "other"


def counts(tree: Path, steps: int) -> dict[str, dict[str, int]]:
    """Call counts per process kind and function of one E1 m2flow run from ``tree``."""
    with tempfile.TemporaryDirectory(prefix="m2flow-calls-") as tmp:
        probe, out = Path(tmp) / "probe", Path(tmp) / "counts"
        probe.mkdir()
        out.mkdir()
        (probe / "sitecustomize.py").write_text(PROBE)
        env = {**os.environ, "M2FLOW_CALLS_DIR": str(out),
               "PYTHONPATH": os.pathsep.join([str(tree), str(probe)])}
        cmd = [sys.executable, str(tree / "benchmarks" / "e1_embodied.py"), *BENCH_ARGS, "--steps", str(steps),
               "--out", str(Path(tmp) / "e1.json")]
        subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result: dict[str, dict[str, int]] = {}
        for f in out.glob("*.json"):
            data = json.loads(f.read_text())
            per = result.setdefault(_kind(data["title"]), {})
            for key, n in data["counts"].items():
                per[_normalize(key)] = per.get(_normalize(key), 0) + n
        if "driver" not in result:
            raise RuntimeError(f"no counts from the driver of {tree}: did the run end before its loop?")
        return result


def per_iteration(tree: Path, short: int, long: int) -> dict[str, dict[str, float]]:
    """Calls per iteration: the difference of a long and a short run over their difference in iterations."""
    a, b = counts(tree, short), counts(tree, long)
    iterations = (long - short) / STEPS_PER_ITERATION
    return {kind: {k: (b[kind].get(k, 0) - a.get(kind, {}).get(k, 0)) / iterations for k in b[kind]}
            for kind in b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the earlier commit to compare with")
    ap.add_argument("--steps", default="16384,32768", help="env steps of the short and the long run")
    ap.add_argument("--min-diff", type=float, default=0.5, help="smallest difference in calls per iteration shown")
    ap.add_argument("--top", type=int, default=15, help="differences shown per process kind")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    short, long = (int(s) for s in args.steps.split(","))
    sides = {"this": per_iteration(ROOT, short, long), "ref": per_iteration(worktree(args.ref), short, long)}
    report: dict[str, list] = {}
    for kind in sorted(set(sides["this"]) | set(sides["ref"])):
        this, ref = sides["this"].get(kind, {}), sides["ref"].get(kind, {})
        diffs = [(k, ref.get(k, 0.0), this.get(k, 0.0)) for k in set(this) | set(ref)
                 if abs(this.get(k, 0.0) - ref.get(k, 0.0)) >= args.min_diff]
        diffs.sort(key=lambda d: -abs(d[2] - d[1]))
        report[kind] = diffs
        calls = sum(this.values()), sum(ref.values())
        print(f"{kind}: {calls[0]:.0f} calls per iteration here, {calls[1]:.0f} at {args.ref}; "
              f"{len(diffs)} function(s) differ by >= {args.min_diff}")
        for k, r, t in diffs[:args.top]:
            print(f"  {t - r:+10.1f}  {r:10.1f} -> {t:10.1f}  {k}")
    out = Path(args.out or HERE / "results" / f"ab_calls_{args.ref}.json")
    totals = {side: {kind: round(sum(c.values()), 1) for kind, c in per.items()} for side, per in sides.items()}
    out.write_text(json.dumps({"benchmark": "ab_calls", "ref": args.ref, "steps": [short, long],
                               "calls_per_iteration": totals, "min_diff": args.min_diff,
                               "differences": {k: [[f, round(r, 1), round(t, 1)] for f, r, t in d]
                                               for k, d in report.items()},
                               "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
    print(f"per-iteration call counts: {out}")


if __name__ == "__main__":
    main()
