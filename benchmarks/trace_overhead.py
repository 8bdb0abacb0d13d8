"""Tracing overhead: the cost of one span in nanoseconds, and traced vs untraced runs of real loops.

Part 1 times the recording primitives in this process (median of several timeit repeats): an enabled
span, an enabled span with arguments, a counter, and the shared no-op span a disabled tracer hands out.
Part 2 runs each chosen workload alternately untraced and traced, A B B A A B ..., on one local Ray,
and compares the median iteration time (warm-up iterations left out); the ratio is taken pair by pair
and its median reported. The workloads:

- ``runtime_demo``: the runtime demo (three worker groups in a pipeline);
- ``embodied``: the embodied PPO loop on CartPole-v1 under the hybrid pipelined plan of
  ``examples/embodied/cartpole_pipelined.yaml`` (env and rollout on their own devices, two stages),
  whose every env step and inference is a span;
- ``reasoning``: the reasoning GRPO loop of ``examples/reasoning/arithmetic_grpo.yaml`` (tiny Qwen2
  model) under a disaggregated plan that streams chunks of 4 prompts through the channels, so the
  trace holds the channel depth counters too.

On a shared machine a step time varies by more than tracing can cost, so the script also gives an
upper bound that noise cannot blur: the events the traced run recorded per step times the measured
cost of one event, as a fraction of the step time (as if every event sat on the critical path, which
most do not).

    python benchmarks/trace_overhead.py                      # runtime_demo, embodied and reasoning, 4 pairs each
    python benchmarks/trace_overhead.py --workloads embodied,reasoning --pairs 3
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
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


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


COUNTER_TRACKS: set[str] = set()  # counter tracks seen in the traced runs (channel depths, device locks)


def _events_per_step(run_dir: str, steps: int) -> float:
    """Spans and counter samples of a traced run's merged trace, per iteration."""
    from m2flow.runtime.trace import load_trace

    events = load_trace(run_dir)["traceEvents"]
    COUNTER_TRACKS.update(e["name"] for e in events if e["ph"] == "C")
    return sum(e["ph"] in ("X", "C") for e in events) / steps


def runtime_demo_step_time(trace: bool, steps: int, warmup: int, batch_size: int = 4096) -> tuple[float, float]:
    """Median seconds per step of the runtime demo after the warm-up, and trace events per step (0 untraced)."""
    from m2flow.metrics import MetricsConfig
    from m2flow.report.load import read_metrics
    from m2flow.workflows.runtime_demo.workflow import RuntimeDemoConfig, run_runtime_demo_config

    with tempfile.TemporaryDirectory() as d:
        cfg = RuntimeDemoConfig(steps=steps, batch_size=batch_size, run_dir=d, trace=trace,
                                metrics=MetricsConfig(sinks=["jsonl"]))
        run_runtime_demo_config(cfg)
        rows = read_metrics(Path(d) / "metrics.jsonl")
        events = _events_per_step(d, steps) if trace else 0.0
    return statistics.median(r["time/step"] for r in rows[warmup:]), events


def embodied_step_time(trace: bool, steps: int, warmup: int, cluster: object) -> tuple[float, float]:
    """Median seconds per iteration of the pipelined CartPole PPO loop, and trace events per iteration."""
    from m2flow.config.loader import load_config
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from m2flow.workflows.embodied.config import EmbodiedConfig

    with tempfile.TemporaryDirectory() as d:
        # 8 envs x 128 steps per iteration; the actor on device 0 with the env (one rank: no gloo).
        cfg = load_config(EmbodiedConfig, ROOT / "examples" / "embodied" / "cartpole_pipelined.yaml", [
            'placement="env: 0, rollout: 1, actor: 0"', f"total_env_steps={steps * 8 * 128}",
            "eval_every=0", f"trace={str(trace).lower()}", f"run_dir={d}", "metrics.sinks=[]"])
        history = train(EMBODIED, cfg, cluster).history
        events = _events_per_step(d, len(history)) if trace else 0.0
    return statistics.median(h["time/iteration_s"] for h in history[warmup:]), events


def reasoning_step_time(trace: bool, steps: int, warmup: int, cluster: object, model_dir: Path) -> tuple[float, float]:
    """Median seconds per iteration of the arithmetic GRPO loop, and trace events per iteration."""
    from m2flow.config.loader import load_config
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING
    from m2flow.workflows.reasoning.config import ReasoningConfig

    with tempfile.TemporaryDirectory() as d:
        # 16 prompts x 8 samples per iteration, generated and trained in chunks of 4 prompts on two devices.
        cfg = load_config(ReasoningConfig, ROOT / "examples" / "reasoning" / "arithmetic_grpo.yaml", [
            'placement="rollout,reward,inference: 0, actor: 1"', "rollout.prompts_per_chunk=4",
            "actor.micro_batch_size=32", "data.prompts_per_step=16", "data.arithmetic.train_size=512",
            f"model.path={model_dir}", "model.warm_start.steps=0", f"steps={steps}", "eval_every=0",
            "checkpoint_every=0", f"trace={str(trace).lower()}", f"run_dir={d}", "metrics.sinks=[]"])
        history = train(REASONING, cfg, cluster).history
        events = _events_per_step(d, len(history)) if trace else 0.0
    return statistics.median(h["time/step"] for h in history[warmup:]), events


def alternate(name: str, run: Callable[[bool], tuple[float, float]], pairs: int) -> dict:
    """Untraced (A) and traced (B) runs of one workload in alternating pairs; medians and per-pair ratios."""
    untraced, traced, ratios, per_step = [], [], [], []
    for i in range(pairs):
        # The order flips every pair: a run starts while the previous run's workers exit,
        # which would otherwise always slow the same side.
        if i % 2 == 0:
            a, _ = run(False)
            b, events = run(True)
        else:
            b, events = run(True)
            a, _ = run(False)
        per_step.append(events)
        untraced.append(a)
        traced.append(b)
        ratios.append(b / a)
        print(f"{name} pair {i}: untraced {a * 1e3:.2f} ms/step, traced {b * 1e3:.2f} ms/step, "
              f"ratio {b / a:.3f}", file=sys.stderr)
    return {
        "pairs": pairs,
        "untraced_step_ms": [x * 1e3 for x in untraced], "traced_step_ms": [x * 1e3 for x in traced],
        "median_untraced_step_ms": statistics.median(untraced) * 1e3,
        "median_traced_step_ms": statistics.median(traced) * 1e3,
        "median_ratio_traced_over_untraced": statistics.median(ratios),
        "ratios": ratios,
        "events_per_step": statistics.median(per_step),
    }


def workload_overhead(workloads: list[str], pairs: int, steps: dict[str, int], warmup: int,
                      workdir: Path) -> dict[str, dict]:
    """``alternate`` for each workload on one shared local Ray."""
    from m2flow.runtime import Cluster, ClusterConfig

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    for attempt in range(3):
        try:
            cluster = Cluster(ClusterConfig())  # one Ray for every run: the runs attach to it
            break
        except Exception:  # noqa: BLE001 - Ray gives its raylet 30 s to start, too little on a loaded machine
            ray.shutdown()
            if attempt == 2:
                raise
            print(f"Ray did not start (attempt {attempt + 1}); retrying", file=sys.stderr)
    runs: dict[str, Callable[[bool], tuple[float, float]]] = {
        "runtime_demo": lambda t: runtime_demo_step_time(t, steps["runtime_demo"], warmup),
        "embodied": lambda t: embodied_step_time(t, steps["embodied"], warmup, cluster),
        "reasoning": lambda t: reasoning_step_time(t, steps["reasoning"], warmup, cluster,
                                                   workdir / "arithmetic-tiny"),
    }
    out = {}
    try:
        for name in workloads:
            COUNTER_TRACKS.clear()
            out[name] = {"steps": steps[name], "warmup_steps": warmup, **alternate(name, runs[name], pairs)}
            out[name]["counter_tracks"] = sorted(COUNTER_TRACKS)
    finally:
        ray.shutdown()
        del cluster
    return out


WORKLOADS = ("runtime_demo", "embodied", "reasoning")
DEFAULT_STEPS = {"runtime_demo": 40, "embodied": 8, "reasoning": 8}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, from {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--pairs", type=int, default=4, help="untraced/traced run pairs per workload")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"iterations per run (default per workload: {DEFAULT_STEPS})")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of each run's median")
    parser.add_argument("--spans-only", action="store_true", help="only the per-span costs")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "trace_overhead.json")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; valid: {list(WORKLOADS)}")
    steps = {w: args.steps or n for w, n in DEFAULT_STEPS.items()}
    if min(steps[w] for w in workloads) <= args.warmup:
        parser.error("--steps must exceed --warmup")

    result: dict = {"span_ns": span_costs()}
    line = (f"trace overhead: span {result['span_ns']['span_enabled']:.0f} ns enabled, "
            f"{result['span_ns']['span_disabled']:.0f} ns disabled "
            f"(empty call {result['span_ns']['baseline_call']:.0f} ns)")
    if not args.spans_only:
        event_ns = max(result["span_ns"]["span_enabled_args"], result["span_ns"]["counter_enabled"])
        result["load_average"] = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="trace-overhead-") as workdir:
            result["workloads"] = workload_overhead(workloads, args.pairs, steps, args.warmup, Path(workdir))
        result["load_average_after"] = os.getloadavg()
        for name, w in result["workloads"].items():
            w["bound_overhead_fraction"] = w["events_per_step"] * event_ns * 1e-6 / w["median_untraced_step_ms"]
            line += (f"; {name} {w['median_traced_step_ms']:.1f} vs {w['median_untraced_step_ms']:.1f} ms/step "
                     f"traced/untraced, pair ratio {w['median_ratio_traced_over_untraced']:.3f}, "
                     f"bound {w['events_per_step']:.0f} events/step = {w['bound_overhead_fraction']:.2%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
