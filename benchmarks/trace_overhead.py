"""Tracing overhead: the cost of one span in nanoseconds, and a traced vs untraced demo run.

Part 1 times the recording primitives in this process (median of several timeit repeats): an enabled
span, an enabled span with arguments, a counter, and the shared no-op span a disabled tracer hands out.
Part 2 runs the runtime demo (three worker groups in a pipeline) alternately untraced and traced,
A B B A A B ..., on one local Ray, and compares the median iteration time (``time/step``, warm-up steps
left out); the ratio is taken pair by pair and its median reported. On a shared machine the demo's
step time varies by more than tracing can cost, so the script also gives an upper bound that noise
cannot blur: the events the traced run recorded per step times the measured cost of one event, as a
fraction of the step time (as if every event sat on the critical path, which most do not).

    python benchmarks/trace_overhead.py                      # defaults: 4 pairs of 40-step runs
    python benchmarks/trace_overhead.py --pairs 5 --steps 80 --batch-size 65536
    python benchmarks/trace_overhead.py --spans-only

Writes ``benchmarks/results/trace_overhead.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def span_costs(number: int = 200_000, repeats: int = 7) -> dict[str, float]:
    """Median nanoseconds per operation for the tracing primitives and an empty baseline."""
    from m2flow.runtime.trace import Tracer

    on = Tracer(None, capacity=10**9)  # in memory, never flushed inside the timed loop
    off = Tracer(enabled=False)

    def baseline() -> None:
        pass

    def span_on() -> None:
        with on.span("train", cat="train"):
            pass

    def span_on_args() -> None:
        with on.span("train", cat="train", mb=3, tokens=512):
            pass

    def span_off() -> None:
        with off.span("train", cat="train", mb=3):
            pass

    def counter_on() -> None:
        on.counter("channel/rollout_out", 3)

    out = {}
    for name, fn in (("baseline_call", baseline), ("span_enabled", span_on),
                     ("span_enabled_args", span_on_args), ("counter_enabled", counter_on),
                     ("span_disabled", span_off)):
        runs = timeit.repeat(fn, number=number, repeat=repeats)
        out[name] = statistics.median(runs) / number * 1e9
        on._events.clear()
    return out


def _demo_step_time(trace: bool, steps: int, batch_size: int, warmup: int) -> tuple[float, float]:
    """Median seconds per step after the warm-up, and trace events recorded per step (0 untraced)."""
    from m2flow.metrics import MetricsConfig
    from m2flow.report.load import read_metrics
    from m2flow.runners.demo import DemoConfig, run_demo_config
    from m2flow.runtime.trace import load_trace

    with tempfile.TemporaryDirectory() as d:
        cfg = DemoConfig(steps=steps, batch_size=batch_size, run_dir=d, trace=trace,
                         metrics=MetricsConfig(sinks=["jsonl"]))
        run_demo_config(cfg)
        rows = read_metrics(Path(d) / "metrics.jsonl")
        events = 0
        if trace:
            events = sum(e["ph"] in ("X", "C") for e in load_trace(d)["traceEvents"])
    return statistics.median(r["time/step"] for r in rows[warmup:]), events / steps


def demo_overhead(pairs: int, steps: int, batch_size: int, warmup: int) -> dict:
    """Alternate untraced (A) and traced (B) demo runs; median step times and per-pair ratios."""
    from m2flow.runtime import Cluster, ClusterConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(ClusterConfig())  # one Ray for every run: the demo attaches to it
    untraced, traced, ratios, per_step = [], [], [], []
    try:
        for i in range(pairs):
            # The order flips every pair: a run starts while the previous run's workers exit,
            # which would otherwise always slow the same side.
            if i % 2 == 0:
                a, _ = _demo_step_time(False, steps, batch_size, warmup)
                b, events = _demo_step_time(True, steps, batch_size, warmup)
            else:
                b, events = _demo_step_time(True, steps, batch_size, warmup)
                a, _ = _demo_step_time(False, steps, batch_size, warmup)
            per_step.append(events)
            untraced.append(a)
            traced.append(b)
            ratios.append(b / a)
            print(f"pair {i}: untraced {a * 1e3:.2f} ms/step, traced {b * 1e3:.2f} ms/step, "
                  f"ratio {b / a:.3f}", file=sys.stderr)
    finally:
        import ray

        ray.shutdown()
        del cluster
    return {
        "pairs": pairs, "steps": steps, "batch_size": batch_size, "warmup_steps": warmup,
        "untraced_step_ms": [x * 1e3 for x in untraced], "traced_step_ms": [x * 1e3 for x in traced],
        "median_untraced_step_ms": statistics.median(untraced) * 1e3,
        "median_traced_step_ms": statistics.median(traced) * 1e3,
        "median_ratio_traced_over_untraced": statistics.median(ratios),
        "ratios": ratios,
        "events_per_step": statistics.median(per_step),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="untraced/traced demo run pairs")
    parser.add_argument("--steps", type=int, default=40, help="demo steps per run")
    parser.add_argument("--batch-size", type=int, default=4096, help="demo numbers per batch")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of each run's median")
    parser.add_argument("--spans-only", action="store_true", help="only the per-span costs")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "trace_overhead.json")
    args = parser.parse_args(argv)

    result: dict = {"span_ns": span_costs()}
    if not args.spans_only:
        demo = demo_overhead(args.pairs, args.steps, args.batch_size, args.warmup)
        event_ns = max(result["span_ns"]["span_enabled_args"], result["span_ns"]["counter_enabled"])
        demo["bound_overhead_fraction"] = (
            demo["events_per_step"] * event_ns * 1e-6 / demo["median_untraced_step_ms"])
        result["demo"] = demo
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    ns = result["span_ns"]
    line = (f"trace overhead: span {ns['span_enabled']:.0f} ns enabled, "
            f"{ns['span_disabled']:.0f} ns disabled (empty call {ns['baseline_call']:.0f} ns)")
    if "demo" in result:
        d = result["demo"]
        line += (f"; demo {d['median_traced_step_ms']:.2f} vs {d['median_untraced_step_ms']:.2f} ms/step "
                 f"traced/untraced, ratio {d['median_ratio_traced_over_untraced']:.3f} "
                 f"(median of {d['pairs']} pairs); bound {d['events_per_step']:.0f} events/step "
                 f"= {d['bound_overhead_fraction']:.2%} of a step")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
