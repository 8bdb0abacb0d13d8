"""The runtime demo (``workflow: runtime_demo``): three worker groups pass tensors along a pipeline.

``producer`` ranks make batches, ``scaler`` ranks double them, ``reducer`` ranks accumulate; the next
batch is produced while the current one is scaled and reduced. It exercises launching under a
placement, rank-ordered gathers, async handles, the device lock (scaler and reducer collocated by
default), per-worker log files, and (with ``trace=true``) the timeline trace and metrics that
``m2flow report`` reads. Its plan is the one its graph gives, with no constraints of its own (``Workflow.plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.config.schema import option
from m2flow.driver.registry import register_workflow
from m2flow.runtime.waiting import gather
from m2flow.driver.run_config import RunConfig
from m2flow.driver.launch import Launched
from m2flow.driver.workflow import Flow, Launch, Workflow
from m2flow.metrics import MetricsConfig
from m2flow.planner import Component, Edge, Plan, WorkflowGraph
from m2flow.runtime.executors import Executor, Handle

GRAPH = WorkflowGraph(
    name="runtime_demo",
    components=(
        Component("producer", "makes batches of uniform numbers", worker="m2flow.workflows.runtime_demo.workers:Producer"),
        Component("scaler", "doubles each batch", holds_model=True, worker="m2flow.workflows.runtime_demo.workers:Scaler"),
        Component("reducer", "accumulates the running mean", holds_model=True,
                  worker="m2flow.workflows.runtime_demo.workers:Reducer"),
    ),
    edges=(Edge("batches", "producer", "scaler", "tensor", kind="p2p"),
           Edge("scaled", "scaler", "reducer", "tensor", kind="p2p")),
)


@dataclass
class RuntimeDemoConfig(RunConfig):
    """The runtime demo: producer, scaler and reducer groups."""

    placement: str = option("producer: 0-1, scaler,reducer: 2-3",
                            "component placement (producer, scaler, reducer); 'local': all in this process")
    run_dir: str = option("runs/runtime_demo", "where logs, trace and metrics are written")
    trace: bool = option(True, "record a timeline trace (run_dir/trace.json)")
    metrics: MetricsConfig = option(
        MetricsConfig(sinks=["console", "jsonl"], key_metrics=["runtime_demo/mean", "perf/numbers_per_s"],
                      extra_prefixes=["runtime_demo"]), "where per-step metrics go (run_dir/metrics.jsonl, ...)")
    steps: int = option(20, "batches each producer rank emits")
    batch_size: int = option(4096, "numbers per batch")

    def validate(self) -> None:
        super().validate()
        for key in ("steps", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")


class RuntimeDemoFlow(Flow):
    """The runtime demo's groups; iteration ``it`` scales and reduces batch ``it`` while batch ``it + 1`` is made. A batch
    made ahead is made again on resume (the producers are seeded per rank), so nothing counts as in flight."""

    description = "runtime demo"

    def __init__(self, cfg: RuntimeDemoConfig, launched: Launched) -> None:
        self.cfg, self.timeout, self.launched = cfg, cfg.fault_tolerance.iteration_timeout_s, launched
        self.producer, self.scaler, self.reducer = launched["producer"], launched["scaler"], launched["reducer"]
        self.iterations = self.progress_total = cfg.steps
        self._made: dict[int, Handle] = {}
        self.mean = 0.0

    def start(self, it: int, horizon: int) -> None:
        if it not in self._made:
            self._made[it] = self.producer.make(it)

    def finish(self, it: int) -> dict[str, float]:
        batches = gather([self._made.pop(it)], self.timeout)[0]
        if it + 1 < self.iterations:
            self._made[it + 1] = self.producer.make(it + 1)  # the next batch is made meanwhile
        n, m = self.scaler.world_size, self.reducer.world_size
        scaled = gather([self.scaler.execute_each("scale", [(batches[i::n],) for i in range(n)])], self.timeout)[0]
        means = gather([self.reducer.execute_each("add", [(scaled[i::m],) for i in range(m)])], self.timeout)[0]
        self.mean = sum(means) / len(means)
        self.done = it + 1
        return {"runtime_demo/mean": self.mean}

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        numbers = self.cfg.batch_size * self.producer.world_size
        return {"time/step": seconds, "perf/numbers_per_s": numbers / seconds}

    def save(self, path: Path) -> dict[str, Any]:
        return {"mean": self.mean}

    def summary(self, history: list[dict[str, float]]) -> str:
        numbers = len(history) * self.cfg.batch_size * self.producer.world_size
        return (f"moved {numbers} numbers through 3 worker groups; mean of doubled uniforms = {self.mean:.4f} "
                "(expected ~1.0)")


class RuntimeDemoWorkflow(Workflow):
    name = "runtime_demo"
    schema = RuntimeDemoConfig
    graph = GRAPH
    help = "the runtime demo: three worker groups pass tensors along a pipeline"

    def launch(self, cfg: RuntimeDemoConfig, plan: Plan, executor: Executor, run: Launch) -> RuntimeDemoFlow:
        from m2flow.workflows.runtime_demo.workers import ProducerSettings

        settings = {"producer": ProducerSettings(batch_size=cfg.batch_size), "scaler": None, "reducer": None}
        return RuntimeDemoFlow(cfg, self.launch_plan(plan, executor, run, settings))

    def profile_length(self, cfg: RuntimeDemoConfig, iterations: int) -> dict[str, Any]:
        return {"steps": iterations}


WORKFLOW = register_workflow(RuntimeDemoWorkflow())


def run_runtime_demo_config(cfg: RuntimeDemoConfig) -> int:
    """Run the runtime demo for a validated config; the process exit status."""
    from m2flow.autoplan.entry import run

    return run(WORKFLOW, cfg)


def run_runtime_demo(overrides: list[str]) -> int:
    """Run the runtime demo with ``key=value`` overrides of its defaults."""
    from m2flow.config.loader import load_config

    return run_runtime_demo_config(load_config(RuntimeDemoConfig, None, overrides))
