"""Math reward verification on every GSM8K reference: accuracy and throughput.

For each of the 8,792 reference solutions (train + test) it builds responses that state the
right answer in several formats and responses with clearly wrong answers, then scores them with
``m2flow.rewards.sandbox.score_batch``:

- accuracy: fraction of right-answer variants verified, fraction of wrong ones rejected;
- throughput (checks/s), measured side by side in alternating rounds (A B A B ..., medians):
  A = the default path (exact-number check in the caller's process, sympy only when needed),
  B = every check sent to the sandbox worker pool;
- symbolic throughput: answers only sympy can decide (``\\sqrt{N^2}``), through the sandbox.

Writes benchmarks/results/rewards_gsm8k.json and prints one summary line.

    python benchmarks/rewards_gsm8k.py [--rounds 3] [--sandbox-checks 4000] [--symbolic-checks 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from m2flow.rewards.extract import reference_answer  # noqa: E402
from m2flow.rewards.sandbox import SandboxPool, VerifyStats, score_batch  # noqa: E402

GSM8K = ROOT / ".." / "shared" / "data" / "gsm8k"
RESULT = ROOT / "benchmarks" / "results" / "rewards_gsm8k.json"


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
        n = int(reference_answer(solution).replace(",", ""))
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
    """A right answer only sympy can decide: |N| written as sqrt(N^2)."""
    n = abs(int(reference_answer(solution).replace(",", "")))
    return rf"\boxed{{\sqrt{{{n}^2}}}}", f"#### {n}"


def timed(
    pairs: list[tuple[str, str]], pool: SandboxPool, fast_path: bool
) -> tuple[list[float], VerifyStats, float]:
    start = time.perf_counter()
    scores, stats = score_batch(
        [p[0] for p in pairs], [p[1] for p in pairs], pool=pool, in_process_fast_path=fast_path
    )
    return scores, stats, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating A/B rounds; medians are reported")
    parser.add_argument("--sandbox-checks", type=int, default=4000, help="checks per round on the all-sandbox side")
    parser.add_argument("--symbolic-checks", type=int, default=200, help="answers that need sympy")
    parser.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args()

    solutions = load_solutions()
    right, wrong = build_checks(solutions)
    checks = right + wrong
    expected = [1.0] * len(right) + [0.0] * len(wrong)
    sandbox_subset = checks[:: max(1, len(checks) // args.sandbox_checks)][: args.sandbox_checks]

    with SandboxPool(num_workers=args.workers, timeout_s=10.0) as pool:
        timed(checks[:50], pool, fast_path=False)  # warm the workers (first sympy use, imports)
        fast_rates, sandbox_rates = [], []
        for _ in range(args.rounds):
            scores, fast_stats, seconds = timed(checks, pool, fast_path=True)
            fast_rates.append(len(checks) / seconds)
            sandbox_scores, sandbox_stats, seconds = timed(sandbox_subset, pool, fast_path=False)
            sandbox_rates.append(len(sandbox_subset) / seconds)
        sandbox_expected = [expected[checks.index(c)] for c in sandbox_subset[:200]]
        assert sandbox_scores[:200] == sandbox_expected, "sandbox path disagrees with the fast path"

        symbolic = [symbolic_check(s) for s in solutions[: args.symbolic_checks]]
        sym_scores, sym_stats, sym_seconds = timed(symbolic, pool, fast_path=True)

    right_ok = sum(s == 1.0 for s in scores[: len(right)])
    wrong_ok = sum(s == 0.0 for s in scores[len(right) :])
    result = {
        "benchmark": "rewards_gsm8k",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "references": len(solutions),
        "right_variants": len(right),
        "wrong_variants": len(wrong),
        "right_verified": right_ok / len(right),
        "wrong_rejected": wrong_ok / len(wrong),
        "symbolic_checks": len(symbolic),
        "symbolic_verified": sum(sym_scores) / len(symbolic),
        "fast_path_checks_per_s": statistics.median(fast_rates),
        "all_sandbox_checks_per_s": statistics.median(sandbox_rates),
        "fast_over_sandbox": statistics.median(f / s for f, s in zip(fast_rates, sandbox_rates)),
        "symbolic_checks_per_s": len(symbolic) / sym_seconds,
        "rounds": args.rounds,
        "fast_path_rates": fast_rates,
        "sandbox_rates": sandbox_rates,
        "fast_path_stats": fast_stats.__dict__,
        "sandbox_stats": sandbox_stats.__dict__,
        "symbolic_stats": sym_stats.__dict__,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"rewards_gsm8k: {len(checks)} checks on {len(solutions)} references | right verified "
        f"{result['right_verified']:.4f} wrong rejected {result['wrong_rejected']:.4f} symbolic verified "
        f"{result['symbolic_verified']:.3f} | fast path {result['fast_path_checks_per_s']:,.0f} checks/s, "
        f"all-sandbox {result['all_sandbox_checks_per_s']:,.0f} checks/s "
        f"(x{result['fast_over_sandbox']:.1f}), symbolic {result['symbolic_checks_per_s']:,.0f} checks/s"
    )


if __name__ == "__main__":
    main()
