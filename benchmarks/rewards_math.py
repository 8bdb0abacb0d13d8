"""Math reward verification (math-verify behind ``score_batch``): accuracy on GSM8K and LaTeX forms, throughput.

1. GSM8K: each of the 8,792 reference solutions (train + test) against responses stating the right
   answer in six forms and two wrong answers (N+1, 2N+3).
2. LaTeX and chat forms (``tests/rewards/latex_forms.py``): fractions, ``\\left( \\right)``, units,
   ``x = ...``, intervals and sets, percentages, thousands separators, long chat responses, and wrong
   answers that contain the right number. ``--compare-root DIR`` also scores them with the
   ``m2flow.rewards.math_verify:math_score`` of another checkout (e.g. an older commit) in a subprocess.
3. Throughput (checks/s) on an evenly spaced subset of the GSM8K checks (the same mix of forms), in
   alternating rounds (A B C A B C ..., medians): A = the default path (plain integers decided in the
   caller's process, the rest in the sandbox), B = every check through the sandbox worker pool,
   C = math-verify in the caller's process, no sandbox (no time limit: for comparison only).
4. Symbolic answers (``\\boxed{\\sqrt{N^2}}``) through the sandbox.

Writes benchmarks/results/rewards_math.json and prints one summary line.

    python benchmarks/rewards_math.py [--rounds 3] [--throughput-checks 4000] [--compare-root /path/to/checkout]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from m2flow.rewards.math_verify import answer_text, library_verify  # noqa: E402
from m2flow.rewards.sandbox import SandboxPool, VerifyStats, score_batch  # noqa: E402
from tests.rewards.latex_forms import CASES  # noqa: E402

GSM8K = ROOT / ".." / "shared" / "data" / "gsm8k"
RESULT = ROOT / "benchmarks" / "results" / "rewards_math.json"
# Scores the LaTeX cases with another checkout's math_score; reads [[response, reference], ...] on stdin.
_COMPARE = (
    "import json, sys; from m2flow.rewards.math_verify import math_score; "
    "print(json.dumps([math_score(r, ref) for r, ref in json.load(sys.stdin)]))"
)


def load_solutions() -> list[str]:
    solutions = []
    for split in ("train", "test"):
        with (GSM8K / f"{split}.jsonl").open() as f:
            solutions += [json.loads(line)["answer"] for line in f if line.strip()]
    return solutions


def build_checks(solutions: list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(response, reference) pairs whose answer is right, and pairs whose answer is wrong."""
    right, wrong = [], []
    for solution in solutions:
        n = int(answer_text(solution).replace(",", ""))
        right += [
            (solution, solution),
            (rf"so the total is \boxed{{{n}}}", solution),
            (rf"\boxed{{{n:,}}}", solution),
            (f"Therefore, the answer is {n:,}.", solution),
            (f"The answer is ${n}.", solution),
            (f"#### {n}", solution),
        ]
        for bad in {n + 1, 2 * n + 3} - {n}:
            wrong += [(rf"\boxed{{{bad}}}", solution), (f"The answer is {bad:,}.", solution)]
    return right, wrong


def symbolic_check(solution: str) -> tuple[str, str]:
    """A right answer only a symbolic comparison can decide: |N| written as sqrt(N^2)."""
    n = abs(int(answer_text(solution).replace(",", "")))
    return rf"\boxed{{\sqrt{{{n}^2}}}}", f"#### {n}"


def timed(
    pairs: list[tuple[str, str]], pool: SandboxPool, fast_path: bool
) -> tuple[list[float], VerifyStats, float]:
    start = time.perf_counter()
    scores, stats = score_batch(
        [p[0] for p in pairs], [p[1] for p in pairs], pool=pool, in_process_fast_path=fast_path
    )
    return scores, stats, time.perf_counter() - start


def latex_table(scores: list[float]) -> dict[str, dict[str, int]]:
    """Per form: right answers verified and wrong answers rejected, out of how many."""
    table: dict[str, dict[str, int]] = collections.defaultdict(
        lambda: {"right": 0, "right_verified": 0, "wrong": 0, "wrong_rejected": 0}
    )
    for case, score in zip(CASES, scores):
        row = table[case.form]
        if case.right:
            row["right"] += 1
            row["right_verified"] += int(score == 1.0)
        else:
            row["wrong"] += 1
            row["wrong_rejected"] += int(score == 0.0)
    return dict(table)


def compare_scores(root: Path) -> list[float]:
    """The LaTeX cases scored by the checkout at ``root`` (its own package, not this one)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    payload = json.dumps([[c.response, c.reference] for c in CASES])
    out = subprocess.run([sys.executable, "-c", _COMPARE], input=payload, capture_output=True, text=True,
                         env=env, cwd=root, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating A/B rounds; medians are reported")
    parser.add_argument("--throughput-checks", type=int, default=4000, help="checks per side and round")
    parser.add_argument("--symbolic-checks", type=int, default=200, help="answers that need sympy")
    parser.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--compare-root", type=Path, default=None,
                        help="another checkout whose math_score also scores the LaTeX forms")
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args()

    solutions = load_solutions()
    right, wrong = build_checks(solutions)
    checks = right + wrong
    expected = [1.0] * len(right) + [0.0] * len(wrong)
    step = max(1, len(checks) // args.throughput_checks)
    subset, subset_expected = checks[::step][: args.throughput_checks], expected[::step][: args.throughput_checks]

    with SandboxPool(num_workers=args.workers, timeout_s=10.0) as pool:
        timed(checks[:50], pool, fast_path=False)  # warm the workers (first parse compiles the patterns)
        scores, full_stats, full_seconds = timed(checks, pool, fast_path=True)  # accuracy: every check
        fast_rates, sandbox_rates, library_rates = [], [], []
        for _ in range(args.rounds):
            fast_scores, fast_stats, seconds = timed(subset, pool, fast_path=True)
            fast_rates.append(len(subset) / seconds)
            sandbox_scores, sandbox_stats, seconds = timed(subset, pool, fast_path=False)
            sandbox_rates.append(len(subset) / seconds)
            start = time.perf_counter()
            library_scores = [float(library_verify(r, ref)) for r, ref in subset]
            library_rates.append(len(subset) / (time.perf_counter() - start))
            assert fast_scores == sandbox_scores == library_scores == subset_expected, "the paths disagree"

        symbolic = [symbolic_check(s) for s in solutions[: args.symbolic_checks]]
        sym_scores, sym_stats, sym_seconds = timed(symbolic, pool, fast_path=True)
        latex_scores, latex_stats, _ = timed([(c.response, c.reference) for c in CASES], pool, fast_path=True)

    latex = latex_table(latex_scores)
    compared = latex_table(compare_scores(args.compare_root)) if args.compare_root else None
    right_ok = sum(s == 1.0 for s in scores[: len(right)])
    wrong_ok = sum(s == 0.0 for s in scores[len(right) :])
    latex_right = sum(r["right_verified"] for r in latex.values())
    latex_wrong = sum(r["wrong_rejected"] for r in latex.values())
    result = {
        "benchmark": "rewards_math",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "references": len(solutions),
        "right_variants": len(right),
        "wrong_variants": len(wrong),
        "right_verified": right_ok / len(right),
        "wrong_rejected": wrong_ok / len(wrong),
        "latex_cases": len(CASES),
        "latex_right_verified": latex_right,
        "latex_right": sum(r["right"] for r in latex.values()),
        "latex_wrong_rejected": latex_wrong,
        "latex_wrong": sum(r["wrong"] for r in latex.values()),
        "latex_by_form": latex,
        "compare_root": str(args.compare_root) if args.compare_root else None,
        "compare_latex_by_form": compared,
        "symbolic_checks": len(symbolic),
        "symbolic_verified": sum(sym_scores) / len(symbolic),
        "throughput_checks": len(subset),
        "full_pass_checks_per_s": len(checks) / full_seconds,
        "default_path_checks_per_s": statistics.median(fast_rates),
        "all_sandbox_checks_per_s": statistics.median(sandbox_rates),
        "library_one_process_checks_per_s": statistics.median(library_rates),
        "symbolic_checks_per_s": len(symbolic) / sym_seconds,
        "rounds": args.rounds,
        "default_path_rates": fast_rates,
        "sandbox_rates": sandbox_rates,
        "library_rates": library_rates,
        "full_pass_stats": full_stats.__dict__,
        "default_path_stats": fast_stats.__dict__,
        "sandbox_stats": sandbox_stats.__dict__,
        "symbolic_stats": sym_stats.__dict__,
        "latex_stats": latex_stats.__dict__,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"rewards_math: GSM8K {len(checks)} checks, right verified {result['right_verified']:.4f} wrong rejected "
        f"{result['wrong_rejected']:.4f} | LaTeX forms right {latex_right}/{result['latex_right']} wrong rejected "
        f"{latex_wrong}/{result['latex_wrong']} | symbolic verified {result['symbolic_verified']:.3f} | default "
        f"path {result['default_path_checks_per_s']:,.0f} checks/s, all-sandbox "
        f"{result['all_sandbox_checks_per_s']:,.0f}, library in one process "
        f"{result['library_one_process_checks_per_s']:,.0f}, symbolic {result['symbolic_checks_per_s']:,.0f}"
    )


if __name__ == "__main__":
    main()
