"""The python tool's sandbox and the reward sandbox: calls/s and checks/s before and after confinement.

1. Python tool calls/s, one worker, a small snippet (``sum(i * i for i in range(1000))``), in
   alternating rounds (A B C A B C ..., medians):
   A = ``none``: the behaviour before the sandbox, kept as ``allow_unsandboxed: true``: a fresh
       forkserver process per call with the network cut (user + network namespaces) and nothing else;
       the fork server preloaded with the pool's module, as it is in a run where the reward pool started it;
   B = ``bwrap``: a bubblewrap-confined host per worker forking one process per call;
   C = ``namespaces``: the same host confined with the kernel's namespaces directly.
   Also the first call of a new tool (the host's start-up).
2. Reward sandbox checks/s: math-verify on symbolic answers (``\\boxed{N\\sqrt{2}}`` against
   ``\\sqrt{2N^2}``) through ``SandboxPool`` with 2 workers, every check in the pool, the same rounds:
   ``none`` (forkserver workers, as before) against the confined hosts of each backend.

Backends that do not work on the machine are left out (and say why). Writes
benchmarks/results/python_tool_sandbox.json and prints one summary line per part.

    python benchmarks/python_tool_sandbox.py [--rounds 3] [--calls 200] [--checks 400]
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

from m2flow.rewards import confine  # noqa: E402
from m2flow.rewards.sandbox import SandboxPool, score_batch  # noqa: E402
from m2flow.rewards.tools.python import PythonTool  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "python_tool_sandbox.json"
SNIPPET = "sum(i * i for i in range(1000))"


def available() -> dict[str, str | None]:
    """Each confined backend -> None if it works here, else why not."""
    return {backend: confine.probe(backend) for backend in ("bwrap", "namespaces")}


def tool_rates(backends: list[str], rounds: int, calls: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, list[float]]] = {b: {"calls_per_s": [], "first_call_s": []} for b in backends}
    for _ in range(rounds):
        for backend in backends:
            start = time.perf_counter()
            tool = PythonTool(timeout_s=10.0, isolation=backend, allow_unsandboxed=backend == "none")
            try:
                assert tool(SNIPPET) == "332833500"
                out[backend]["first_call_s"].append(time.perf_counter() - start)
                start = time.perf_counter()
                for _ in range(calls):
                    tool(SNIPPET)
                out[backend]["calls_per_s"].append(calls / (time.perf_counter() - start))
            finally:
                tool.close()
    return {b: {k: statistics.median(v) for k, v in d.items()} for b, d in out.items()}


def reward_rates(backends: list[str], rounds: int, checks: int) -> dict[str, dict[str, float]]:
    pairs = [(rf"\boxed{{{n}\sqrt{{2}}}}", rf"\sqrt{{{2 * n * n}}}") for n in range(2, checks + 2)]
    responses, references = [p[0] for p in pairs], [p[1] for p in pairs]
    pools, starts = {}, {}
    for backend in backends:  # started once: a run keeps its reward pool
        start = time.perf_counter()
        pools[backend] = SandboxPool(num_workers=2, timeout_s=30.0, isolation=backend)
        score_batch(responses[:20], references[:20], pool=pools[backend], in_process_fast_path=False)
        starts[backend] = time.perf_counter() - start
    rates: dict[str, list[float]] = {b: [] for b in backends}
    try:
        for _ in range(rounds):
            for backend in backends:
                scores, stats = score_batch(responses, references, pool=pools[backend], in_process_fast_path=False)
                assert scores == [1.0] * checks and stats.failures == 0, (backend, stats)
                rates[backend].append(checks / stats.seconds)
    finally:
        for pool in pools.values():
            pool.close()
    return {b: {"checks_per_s": statistics.median(rates[b]), "start_s": starts[b]} for b in backends}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="python tool calls per backend and round")
    parser.add_argument("--checks", type=int, default=400, help="reward checks per backend and round")
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args()

    why = available()
    backends = ["none"] + [b for b, reason in why.items() if reason is None]
    tool = tool_rates(backends, args.rounds, args.calls)
    reward = reward_rates(backends, args.rounds, args.checks)
    result = {
        "benchmark": "python_tool_sandbox",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "unavailable": {b: r for b, r in why.items() if r is not None},
        "python_tool": tool,
        "python_tool_vs_none": {b: tool[b]["calls_per_s"] / tool["none"]["calls_per_s"] for b in backends},
        "reward": reward,
        "reward_vs_none": {b: reward[b]["checks_per_s"] / reward["none"]["checks_per_s"] for b in backends},
        "rounds": args.rounds,
        "calls": args.calls,
        "checks": args.checks,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print("python tool calls/s: " + ", ".join(
        f"{b} {tool[b]['calls_per_s']:.1f} ({result['python_tool_vs_none'][b]:.2f}x, first call "
        f"{tool[b]['first_call_s']:.2f} s)" for b in backends))
    print("reward checks/s: " + ", ".join(
        f"{b} {reward[b]['checks_per_s']:.1f} ({result['reward_vs_none'][b]:.2f}x, start {reward[b]['start_s']:.1f} s)"
        for b in backends))


if __name__ == "__main__":
    main()
