"""The runtime demo: three worker groups pass tensors along a pipeline, with progress on the console.

``producer`` ranks make batches, ``scaler`` ranks transform them, ``reducer`` ranks accumulate; the
driver wires them with asynchronous handles so the stages overlap. It exercises launching under a
placement, rank-ordered gathers, async handles, the device lock (scaler and reducer are collocated),
per-worker log files, and (with ``trace=true``) the timeline trace and metrics that ``m2flow report``
reads: ``run_dir/trace.json`` and ``run_dir/metrics.jsonl``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from m2flow.metrics import MetricsConfig, MetricsLogger, Timings
from m2flow.runtime import Cluster, ClusterConfig, PlacementError, WorkerGroup
from m2flow.runtime.cluster import check_placement
from m2flow.runtime.logs import setup_logging
from m2flow.runtime.trace import ProcessInfo, Tracer, merge_traces, prepare_trace_dir
from m2flow.runtime.worker import Worker

log = logging.getLogger(__name__)

COMPONENTS = ("producer", "scaler", "reducer")


@dataclass
class DemoConfig:
    """The runtime demo."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig, metadata={"doc": "where workers run"})
    placement: str = field(
        default="producer: 0-1, scaler,reducer: 2-3",
        metadata={"doc": "component placement (producer, scaler, reducer)"},
    )
    steps: int = field(default=20, metadata={"doc": "batches each producer rank emits"})
    batch_size: int = field(default=4096, metadata={"doc": "numbers per batch"})
    run_dir: str = field(default="runs/demo", metadata={"doc": "where logs, trace and metrics are written"})
    trace: bool = field(default=True, metadata={"doc": "record a timeline trace (run_dir/trace.json)"})
    metrics: MetricsConfig = field(
        default_factory=lambda: MetricsConfig(sinks=["console", "jsonl"],
                                              key_metrics=["demo/mean", "perf/numbers_per_s"]),
        metadata={"doc": "where per-step metrics go (run_dir/metrics.jsonl, ...)"},
    )

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        try:
            check_placement(self.placement, self.cluster, COMPONENTS)
        except PlacementError as e:
            raise ValueError(f"placement: {e}") from None


class Producer(Worker):
    def __init__(self, batch_size: int) -> None:
        import torch

        self.gen = torch.Generator().manual_seed(self.rank)
        self.batch_size = batch_size

    def make(self, step: int):
        import torch

        self.log.info("batch %d", step)
        return torch.rand(self.batch_size, generator=self.gen)


class Scaler(Worker):
    def scale(self, batches: list):
        import torch

        with self.device_turn():
            return torch.cat(batches) * 2.0


class Reducer(Worker):
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, parts: list) -> float:
        with self.device_turn():
            for t in parts:
                self.total += float(t.sum())
                self.count += t.numel()
        return self.total / max(self.count, 1)


def run_demo_config(cfg: DemoConfig) -> int:
    """Run the demo for a validated config; returns a process exit code."""
    run_dir = Path(cfg.run_dir)
    setup_logging(log_file=run_dir / "driver.log", console=False)
    # A fresh run: shards or metric lines of an earlier demo in the same dir would mix with this one.
    trace_dir = prepare_trace_dir(run_dir) if cfg.trace else None
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    tracer = Tracer(trace_dir, ProcessInfo("driver"), enabled=cfg.trace)
    cluster = Cluster(cfg.cluster)
    plan = cluster.placement(cfg.placement, components=COMPONENTS)
    log.info("cluster %s, placement mode %s", cluster, plan.mode)
    logs = run_dir / "logs"
    groups = dict(log_dir=logs, trace_dir=trace_dir)
    producer = WorkerGroup(Producer, cluster, "producer", placement=plan["producer"],
                           args=(cfg.batch_size,), **groups)
    scaler = WorkerGroup(Scaler, cluster, "scaler", placement=plan["scaler"], **groups)
    reducer = WorkerGroup(Reducer, cluster, "reducer", placement=plan["reducer"], **groups)
    metrics = MetricsLogger(run_dir, cfg.metrics, total_steps=cfg.steps,
                            description=f"demo ({plan.mode})", extra_prefixes=("demo",))
    timings = Timings()
    per_step = cfg.batch_size * len(plan["producer"].ranks)
    start = time.time()
    mean = 0.0
    try:
        pending = producer.make(0)
        for step in range(cfg.steps):
            # The step span is the iteration marker reports slice time by.
            with tracer.span("step", cat="step", step=step), timings("time/step"):
                with timings("time/produce_wait"):
                    batches = pending.wait()
                if step + 1 < cfg.steps:
                    pending = producer.make(step + 1)  # the next batch is produced meanwhile
                # Split the gathered batches over the scaler ranks, then every reducer rank gets
                # its share of the scaled output.
                n = scaler.world_size
                with timings("time/scale"):
                    scaled = scaler.execute_each("scale", [(batches[i::n],) for i in range(n)]).wait()
                m = reducer.world_size
                with timings("time/reduce"):
                    means = reducer.execute_each("add", [(scaled[i::m],) for i in range(m)]).wait()
                mean = sum(means) / len(means)
            times = timings.pop()
            metrics.log({**times, "perf/numbers_per_s": per_step / times["time/step"],
                         "demo/mean": mean}, step)
    finally:
        metrics.close()
        for g in (producer, scaler, reducer):
            g.shutdown()  # flushes each rank's trace shard first
        cluster.shutdown()
        tracer.close()
    elapsed = time.time() - start
    numbers = cfg.steps * per_step
    log.info("done: %d numbers in %.2fs, mean %.4f", numbers, elapsed, mean)
    # The demo doubles uniform(0, 1) numbers, so the running mean approaches 1.0.
    summary = (f"moved {numbers} numbers through 3 worker groups in {elapsed:.1f}s; "
               f"mean of doubled uniforms = {mean:.4f} (expected ~1.0); logs in {logs}")
    if cfg.trace:
        summary += f"; trace in {merge_traces(run_dir)} (see: m2flow report {run_dir})"
    metrics.print(summary)
    return 0


def run_demo(overrides: list[str]) -> int:
    """Entry point of ``m2flow demo [key=value ...]``."""
    from m2flow.config.loader import load_config

    cfg = load_config(DemoConfig, None, overrides)
    return run_demo_config(cfg)


def _register() -> None:
    from m2flow.workflows.registry import register_workflow

    register_workflow("demo", DemoConfig, run_demo_config)


_register()
