"""This checkout against an earlier commit, on one benchmark's m2flow side, interleaved (A B A B ...).

A change that only restructures code must not slow a workload down. This script checks out ``--ref``
into a worktree under ``benchmarks/.venvs/ab/`` (git-ignored), then runs the chosen benchmark's m2flow
side alternately from this checkout (A) and from that one (B), with the same arguments and the same
Python environment (A B, then B A, so neither side always runs first), and reports each round's figure
and the median ratio A / B:

- ``g1``: ``g1_reasoning.py --sides m2flow``, completions per second of one plan;
- ``e1``: ``e1_embodied.py --sides m2flow``, env steps per second of the whole run (start-up included);
- ``a1``: ``a1_agentic.py`` without TRL, trajectories per second of the training loop of one short run of
  the ``local`` plan (``--extra "--plans collocated"`` for another plan; the warm start is made once, in
  ``--warm-start-dir``, shared by both sides).

    python benchmarks/ab_code.py g1 --ref ebb796a --rounds 3
    python benchmarks/ab_code.py e1 --ref ebb796a --rounds 3
    python benchmarks/ab_code.py a1 --ref ebb796a --rounds 3

Writes ``benchmarks/results/ab_<bench>.json`` and prints one summary line.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

BENCHES = {
    "g1": {"script": "g1_reasoning.py",
           "args": ["--sides", "m2flow", "--plans", "collocated+lean", "--threads", "2", "--repeats", "1"],
           "figure": "completions_per_s"},
    "e1": {"script": "e1_embodied.py",
           "args": ["--sides", "m2flow", "--steps", "32768", "--repeats", "1", "--raw-steps", "0"],
           "figure": "env_steps_per_s"},
    "a1": {"script": "a1_agentic.py",
           "args": ["--trl", "", "--plans", "local", "--rounds", "1", "--steps", "12", "--eval-episodes", "20",
                    "--warm-start-dir", str(ROOT / "runs" / "a1")],
           "figure": "trajectories_per_s"},
}


def worktree(ref: str) -> Path:
    """A checkout of ``ref`` beside the benchmarks' virtual environments (made once, reused)."""
    path = HERE / ".venvs" / "ab" / ref
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True)
    return path


def figure(bench: str, out: Path) -> float:
    """The m2flow side's figure in one result file."""
    data = json.loads(out.read_text())
    if bench == "g1":
        runs = [r for per in data["runs"].values() for rs in per.values() for r in rs]
        return statistics.median(r["completions_per_s"] for r in runs)
    if bench == "a1":
        return statistics.median(r["trajectories_per_s"] for rs in data["runs"].values() for r in rs)
    summary = next(iter(data["summary"].values()))
    return float(summary["m2flow"]["env_steps_per_s"])


def run_side(bench: str, tree: Path, extra: list[str], out: Path) -> float:
    spec = BENCHES[bench]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / "benchmarks" / spec["script"]), *spec["args"], *extra, "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return figure(bench, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", choices=sorted(BENCHES))
    ap.add_argument("--ref", required=True, help="the earlier commit to compare with")
    ap.add_argument("--rounds", type=int, default=3, help="A B rounds")
    ap.add_argument("--extra", default="", help="more arguments for the benchmark, space-separated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    old = worktree(args.ref)
    extra = args.extra.split()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="m2flow-ab-") as tmp:
        for r in range(args.rounds):
            row: dict = {"load_average": round(os.getloadavg()[0], 2)}  # a busy machine widens the spread
            order = (("this", ROOT), ("ref", old)) if r % 2 == 0 else (("ref", old), ("this", ROOT))
            for side, tree in order:  # A B, then B A: neither side always runs first
                row[side] = run_side(args.bench, tree, extra, Path(tmp) / f"{side}{r}.json")
            row["ratio"] = row["this"] / row["ref"]
            rounds.append(row)
            print(f"round {r + 1}: this {row['this']:.1f}, {args.ref} {row['ref']:.1f}, ratio {row['ratio']:.3f} "
                  f"(load {row['load_average']})", flush=True)
    result = {"benchmark": f"ab_{args.bench}", "ref": args.ref, "figure": BENCHES[args.bench]["figure"],
              "args": BENCHES[args.bench]["args"] + extra, "rounds": rounds,
              "median_ratio": statistics.median(r["ratio"] for r in rounds),
              "load_average": list(os.getloadavg()), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out or HERE / "results" / f"ab_{args.bench}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"{args.bench}: this checkout / {args.ref} = {result['median_ratio']:.3f} (median of {args.rounds} "
          f"rounds, {result['figure']}); {out}")


if __name__ == "__main__":
    main()
