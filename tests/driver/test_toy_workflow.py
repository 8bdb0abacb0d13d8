"""A workflow in this one module, no edit in the package: a source of noisy samples and a learner of their
mean, one edge, one fusion (the source in the learner's processes), one ``Tunable`` plan setting (the
micro-batch). It declares a graph, workers and a short flow; ``launch_plan`` starts what the Plan says. It runs
on the local executor and on Ray, and ``placement: auto`` profiles, searches and plans it like any workflow."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from m2flow.config import from_dict
from m2flow.config.schema import option
from m2flow.driver.launch import Launched
from m2flow.driver.registry import get_workflow, register_workflow
from m2flow.runtime.waiting import gather
from m2flow.driver.run_config import RunConfig
from m2flow.driver.workflow import Flow, Launch, Tunable, Workflow
from m2flow.metrics import MetricsConfig
from m2flow.planner import Component, Edge, Fusion, Plan, PlanError, WorkflowGraph
from m2flow.planner.choice import PlanChoice
from m2flow.planner.setup import Workload
from m2flow.runtime.executors import Executor
from m2flow.runtime.worker import Worker

@dataclass
class SourceConfig:
    """The source ranks."""

    batch: int = option(64, "samples per iteration, shared by the source ranks")
    num_threads: int = option(1, "torch threads per rank")
    fuse_with_learner: bool = option(False, "make the samples inside the learner's processes")


@dataclass
class LearnerConfig:
    """The learner ranks."""

    lr: float = option(0.2, "learning rate")
    num_threads: int = option(1, "torch threads per rank")
    delay_s: float = option(0.0, "seconds each step sleeps (fault tests)")
    hang_once_in: str = option("", "'evaluate' or 'save': hang there once while `marker` exists (fault tests)")
    marker: str = option("", "the file whose presence arms hang_once_in")
    sample_cost_s: float = option(0.0, "seconds of divisible work per sample, shared by the learner ranks")
    micro_batch: int | None = option(None, "samples per learner call, a gradient step after the last (None: the "
                                           "whole batch); it divides source.batch, the source ranks divide it")


@dataclass
class ToyConfig(RunConfig):
    """Fit the mean of noisy samples."""

    placement: str = option("source,learner: 0", "devices of source and learner")
    metrics: MetricsConfig = option(MetricsConfig(sinks=["jsonl"], extra_prefixes=["toy"]), "metric sinks")
    source: SourceConfig = option(SourceConfig(), "the source")
    learner: LearnerConfig = option(LearnerConfig(), "the learner")
    target: float = option(3.0, "the mean to learn")
    steps: int = option(8, "iterations")


@dataclass(frozen=True)
class ToySettings:
    """Both workers' settings: the plan's ``batch`` samples of ``target`` per iteration, shared by the source's
    ``ranks``, made and learned ``micro_batch`` (all ranks') per call; the learner's config section. Fused, they
    are the source's part in the learner process."""

    batch: int
    micro_batch: int
    target: float
    seed: int
    ranks: int
    learner: LearnerConfig

    def make(self, iteration: int, chunk: int, ranks: Sequence[int]) -> torch.Tensor:
        """Micro-batch ``chunk`` of the samples of source ``ranks``, in rank order."""
        per, size = self.batch // self.ranks, self.micro_batch // self.ranks
        gens = [torch.Generator().manual_seed(self.seed * 100_003 + iteration * 101 + r) for r in ranks]
        return torch.cat([(torch.randn(per, generator=g) + self.target)[chunk * size:(chunk + 1) * size] for g in gens])

    def hosted_in(self, host: Worker) -> ToySettings:
        return self  # a learner rank makes every source rank's samples itself


class Source(Worker):
    def __init__(self, *, settings: ToySettings) -> None:
        self.settings = settings

    def make(self, iteration: int, chunk: int) -> torch.Tensor:
        return self.settings.make(iteration, chunk, [self.rank])


class Learner(Worker):
    """Fits one number: each call adds a micro-batch's gradient, the iteration's last takes the step. For the
    fault tests, ``delay_s`` slows every step and ``hang_once_in`` ("evaluate" or "save") makes the first such
    call hang (until its process is killed) when the file ``marker`` exists, removing it."""

    def __init__(self, *, settings: ToySettings, hosted: dict[str, Any] | None = None) -> None:
        self.cfg, self.batch, self.chunks = settings.learner, settings.batch, settings.batch // settings.micro_batch
        self.value = torch.zeros((), requires_grad=True)
        self.opt = torch.optim.SGD([self.value], lr=self.cfg.lr)
        self._loss, self._busy = 0.0, 0.0
        self.host_components(hosted)

    def value_in(self, phase: str) -> float:
        if self.cfg.hang_once_in == phase and self.cfg.marker and os.path.exists(self.cfg.marker):
            os.unlink(self.cfg.marker)
            time.sleep(3600)
        return float(self.value.detach())

    def learn(self, iteration: int, chunk: int, samples: list[torch.Tensor] | None) -> dict[str, float]:
        start = time.perf_counter()
        time.sleep(self.cfg.delay_s)
        fused = self.hosted("source") if samples is None else None  # fused, this rank makes every source rank's
        data = torch.cat(samples) if fused is None else fused.make(iteration, chunk, range(fused.ranks))
        with self.device_turn():
            time.sleep(self.cfg.sample_cost_s * len(data) / self.world_size)  # work data parallelism divides
            loss = ((self.value - data) ** 2).sum() / self.batch  # this micro-batch's part of the mean
            loss.backward()
            self._loss += float(loss.detach())
            if chunk == self.chunks - 1:
                self.opt.step()
                self.opt.zero_grad()
        self._busy += time.perf_counter() - start
        if chunk < self.chunks - 1:
            return {}
        out = {"toy/loss": self._loss, "toy/micro_batches": float(self.chunks), "time/learner_busy_s": self._busy}
        self._loss, self._busy = 0.0, 0.0
        return out

    def set(self, value: float) -> None:
        with torch.no_grad():
            self.value.fill_(value)


GRAPH = WorkflowGraph(
    name="toy_mean",
    components=(
        Component("source", "noisy samples of the target", worker=f"{__name__}:Source", section="source",
                  timing="time/source_busy_s"),
        Component("learner", "fits the mean of the samples", holds_model=True, trains=True, worker=f"{__name__}:Learner",
                  section="learner", timing="time/learner_busy_s"),
    ),
    edges=(Edge("samples", "source", "learner", "tensor", kind="p2p"),),
    fusions=(Fusion("source", "learner", "on the learner's devices rank for rank", key="source.fuse_with_learner"),),
)


class ToyFlow(Flow):
    """Iteration ``it``: the source makes samples (unless fused), the learner steps on them by micro-batches."""

    def __init__(self, cfg: ToyConfig, plan: Plan, launched: Launched, run: Launch) -> None:
        self.cfg, self.timeout, self.launched = cfg, cfg.fault_tolerance.iteration_timeout_s, launched
        self.source = None if plan.fused("source") else launched["source"]
        self.learner, self.chunks = launched["learner"], plan.settings["batch"] // plan.settings["micro_batch"]
        self.iterations = self.progress_total = cfg.steps
        self.done, self._made = run.start, {}
        if run.state is not None:
            gather([self.learner.set(run.state["value"])], self.timeout)

    def start(self, it: int, horizon: int) -> None:
        if self.source is not None and it not in self._made:
            self._made[it] = [self.source.make(it, k) for k in range(self.chunks)]

    def finish(self, it: int) -> dict[str, float]:
        made_s, out = 0.0, {}
        for k, handle in enumerate(self._made.pop(it, [None] * self.chunks)):
            t0 = time.perf_counter()
            samples = None if handle is None else gather([handle], self.timeout)[0]
            made_s += time.perf_counter() - t0
            out = gather([self.learner.learn(it, k, samples)], self.timeout)[0][0]
        self.done = it + 1
        return {**out, "time/source_busy_s": made_s}

    def evaluate(self) -> dict[str, float]:
        value = gather([self.learner.value_in("evaluate", ranks=[0])], self.timeout, "an evaluation")[0][0]
        return {"eval/error": abs(value - self.cfg.target)}

    def save(self, path: Path) -> dict[str, Any]:
        return {"value": gather([self.learner.value_in("save", ranks=[0])], self.timeout, "a checkpoint")[0][0]}


class ToyWorkflow(Workflow):
    name, schema, graph, help = "toy_mean", ToyConfig, GRAPH, "fit the mean of noisy samples"
    tunables = (Tunable("micro_batch", "learner.micro_batch",  # the whole batch, its half, its quarter
                        lambda cfg: tuple(sorted({cfg.source.batch // k for k in (1, 2, 4) if cfg.source.batch % k == 0}))),)

    def settings(self, cfg: ToyConfig, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
        batch = cfg.source.batch
        micro, ranks = values.get("micro_batch", cfg.learner.micro_batch or batch), plan["source"].world_size
        if batch % micro or micro % ranks:
            raise PlanError(f"micro-batches of {micro} samples do not split a batch of {batch} over {ranks} "
                            "source rank(s)")
        return {"batch": batch, "micro_batch": micro}

    def workload(self) -> Workload:
        return Workload(chain=("source", "learner"), items=("batch",), micro_items=("micro_batch",),
                        inputs={"learner": ("samples",)}, categories={"source": "make", "learner": "train"})

    def launch(self, cfg: ToyConfig, plan: Plan, executor: Executor, run: Launch) -> ToyFlow:
        batch, micro = plan.settings["batch"], plan.settings["micro_batch"]  # the plan's, never the config's
        both = ToySettings(batch, micro, cfg.target, cfg.seed, plan["source"].world_size, cfg.learner)
        return ToyFlow(cfg, plan, self.launch_plan(plan, executor, run, {"source": both, "learner": both}), run)

    def profile_length(self, cfg: ToyConfig, iterations: int) -> dict[str, Any]:
        return {"steps": iterations, "eval_every": 0}

    def edge_bytes(self, cfg: ToyConfig) -> dict[str, float]:
        return {"samples": 4.0}


WORKFLOW = register_workflow(ToyWorkflow())



def _config(tmp_path: Path, **overrides: Any) -> ToyConfig:
    return from_dict(ToyConfig, {"run_dir": str(tmp_path / "run"), "steps": 8, "eval_every": 4, **overrides})


def _train(cfg: ToyConfig, cluster: Any = None):
    from m2flow.autoplan.entry import train

    return train(get_workflow("toy_mean"), cfg, cluster)


@pytest.mark.learning
def test_the_toy_workflow_learns_on_the_local_executor_fused_or_not(tmp_path):
    apart = _train(_config(tmp_path / "apart", placement="local"))
    fused = _train(_config(tmp_path / "fused", placement="local", source={"fuse_with_learner": True}))
    assert not apart.plan.fused("source") and fused.plan.fused("source")
    assert "source" not in fused.plan.launched and fused.plan.edge("samples").transport == "in-process"
    # The baseline, after iteration 4 and after the last: the error shrinks as it learns.
    errors = [m["eval/error"] for _, m in apart.evaluations]
    assert [step for step, _ in apart.evaluations] == [0, 4, 8] and errors[-1] < errors[0] / 4
    # Fusing changes where the samples are made, never what is computed.
    assert [h["toy/loss"] for h in apart.history] == [h["toy/loss"] for h in fused.history]
    assert json.loads((tmp_path / "fused" / "run" / "plan.json").read_text())["workflow"] == "toy_mean"


def test_the_plans_micro_batch_is_what_the_learner_takes(tmp_path):
    whole = _train(_config(tmp_path / "whole", placement="local"))
    micro = _train(_config(tmp_path / "micro", placement="local", learner={"micro_batch": 16}))
    assert whole.plan.settings["micro_batch"] == 64 and micro.plan.settings["micro_batch"] == 16
    assert [h["toy/micro_batches"] for h in micro.history] == [4.0] * 8
    # Four micro-batches add up to the gradient of the whole batch: the same learning, up to rounding.
    assert [h["toy/loss"] for h in micro.history] == pytest.approx([h["toy/loss"] for h in whole.history], rel=1e-5)


def test_a_plan_choice_becomes_config_only_through_the_workflow(tmp_path):
    from m2flow.runtime.placement import NodeLayout

    wf = get_workflow("toy_mean")
    cfg = _config(tmp_path)
    space = wf.search_space(cfg, wf.plan(cfg, NodeLayout((2,))))
    # The search varies plan settings by the Plan's own names, and fusions as (component, host) pairs.
    assert space.varied == {"micro_batch": (16, 32, 64)} and space.fusions == (("source", "learner"),)
    choice = PlanChoice.of("source,learner: 0-1", [("source", "learner")], {"micro_batch": 32})
    assert wf.overrides(choice) == {"placement": "source,learner: 0-1", "source.fuse_with_learner": True,
                                    "learner.micro_batch": 32}
    # The search's choice is built into a Plan as it is: no config key on the way.
    plan = wf.plan(cfg, NodeLayout((2,)), choice)
    assert plan.fused("source") and plan.settings["micro_batch"] == 32 and plan["learner"].world_size == 2
    with pytest.raises(PlanError, match="do not split a batch of 64"):  # refused as the search would see it
        wf.plan(cfg, NodeLayout((2,)), PlanChoice.of("source: 0-1, learner: 0", settings={"micro_batch": 3}))
    with pytest.raises(ValueError, match="no tunable plan setting \\['stages'\\]"):
        wf.overrides(PlanChoice.of("local", settings={"stages": 2}))
    with pytest.raises(ValueError, match="no tunable plan setting \\['stages'\\]"):
        wf.plan(cfg, NodeLayout((2,)), PlanChoice.of("local", settings={"stages": 2}))


@pytest.mark.learning
@pytest.mark.ray
def test_placement_auto_profiles_searches_and_runs_the_toy_workflow_on_ray(tmp_path):
    from tests.ray_session import shared_cluster

    # The learner's work divides over its ranks, so the planner's best plan spreads over both devices.
    cfg = _config(tmp_path, placement="auto", cluster={"cpu_devices_per_node": 2}, checkpoint_every=4,
                  auto={"profile_iterations": 2}, learner={"sample_cost_s": 0.002})
    result = _train(cfg, shared_cluster())
    record = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert record["runs_with"]["placement"] == result.plan.placement  # the plan it chose is the plan that ran
    assert record["runs_with"]["learner.micro_batch"] == result.plan.settings["micro_batch"]
    assert record["chosen"]["choice"]["settings"] == {"micro_batch": result.plan.settings["micro_batch"]}
    assert len(result.history) == 8 and result.plan.executor == "ray"
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert set(profile["components"]) == {"source", "learner"}
    errors = [m["eval/error"] for _, m in result.evaluations]
    assert errors[-1] < errors[0] / 4
