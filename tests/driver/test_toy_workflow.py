"""A third workflow written in this one module, with no edit anywhere in the package: two components
(a source of noisy samples, a learner that fits their mean), one edge, one fusion (the source inside the
learner's processes), one plan setting the search may vary (the micro-batch: samples per learner call,
a ``Tunable`` with its config key). Registered here, it runs on the local executor and on Ray, and
``placement: auto`` profiles, searches and plans it like the shipped workflows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from m2flow.config import from_dict
from m2flow.config.schema import option
from m2flow.driver.registry import get_workflow, register_workflow
from m2flow.runtime.waiting import gather
from m2flow.driver.run_config import RunConfig
from m2flow.driver.workflow import Launch, Tunable, Workflow
from m2flow.metrics import MetricsConfig
from m2flow.planner import Component, Edge, Fusion, Plan, PlanError, WorkflowGraph
from m2flow.planner.choice import PlanChoice
from m2flow.planner.setup import Workload
from m2flow.runtime.executors import Executor
from m2flow.runtime.worker import Worker

HERE = "tests.driver.test_toy_workflow"


# ----------------------------------------------------------------------------- the workers


def rank_samples(seed: int, iteration: int, rank: int, batch: int, target: float) -> torch.Tensor:
    """One source rank's noisy samples of ``target`` for one iteration."""
    return torch.randn(batch, generator=torch.Generator().manual_seed(seed * 100_003 + iteration * 101 + rank)) + target


def rank_chunk(seed: int, iteration: int, rank: int, batch: int, target: float, chunk: int, size: int) -> torch.Tensor:
    """Micro-batch ``chunk`` of one source rank's samples (``size`` of its ``batch`` each)."""
    return rank_samples(seed, iteration, rank, batch, target)[chunk * size:(chunk + 1) * size]


def make_samples(seed: int, iteration: int, ranks: int, batch: int, target: float, chunk: int,
                 size: int) -> torch.Tensor:
    """Micro-batch ``chunk`` of every source rank's samples for one iteration, in rank order."""
    return torch.cat([rank_chunk(seed, iteration, r, batch, target, chunk, size) for r in range(ranks)])


@dataclass(frozen=True)
class SourceSettings:
    """The source: ``batch`` samples of ``target`` per iteration, shared by its ``ranks``, in micro-batches
    of ``micro_batch`` (all ranks') per call; batch and micro-batch are the plan's."""

    batch: int
    micro_batch: int
    target: float
    seed: int
    ranks: int

    def hosted_in(self, host: Worker) -> FusedSource:
        """Inside the learner's processes: each learner rank makes every source rank's samples."""
        return FusedSource(self)


class FusedSource:
    """The source hosted in a learner rank: every source rank's samples of an iteration, made here."""

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings

    def make_all(self, iteration: int, chunk: int) -> torch.Tensor:
        s = self.settings
        return make_samples(s.seed, iteration, s.ranks, s.batch // s.ranks, s.target, chunk, s.micro_batch // s.ranks)


class Source(Worker):
    """Makes ``batch`` noisy samples per iteration, one micro-batch of ``micro_batch`` (all ranks') per call."""

    def __init__(self, *, settings: SourceSettings) -> None:
        self.batch, self.micro_batch = settings.batch, settings.micro_batch
        self.target, self.seed = settings.target, settings.seed

    def make(self, iteration: int, chunk: int) -> torch.Tensor:
        n = self.world_size
        return rank_chunk(self.seed, iteration, self.rank, self.batch // n, self.target, chunk, self.micro_batch // n)


@dataclass(frozen=True)
class LearnerSettings:
    """The learner: its step size, the plan's batch and micro-batches per iteration, and the fault tests' knobs."""

    lr: float
    batch: int
    chunks: int
    delay_s: float = 0.0
    hang_once_in: str = ""
    marker: str = ""
    sample_cost_s: float = 0.0


class Learner(Worker):
    """Fits one number to the samples by gradient steps; with the source hosted it makes the samples itself.

    Each call takes one micro-batch of the iteration's ``batch`` samples and adds its gradient; the call
    with the last one (``chunks`` per iteration) takes the step and returns the iteration's metrics.

    ``sample_cost_s`` stands for compute that data parallelism divides: each rank spends its share of it per
    sample (every rank still computes the same update, so ranks stay equal). For the fault tests:
    ``delay_s`` slows every step, and ``hang_once_in`` ("evaluate" or "save") makes
    the first such call hang (until its process is killed) when the file ``marker`` exists, removing it."""

    def __init__(self, *, settings: LearnerSettings, hosted: dict[str, Any] | None = None) -> None:
        self.value = torch.zeros((), requires_grad=True)
        self.opt = torch.optim.SGD([self.value], lr=settings.lr)
        self.batch, self.chunks = settings.batch, settings.chunks
        self._loss, self._busy = 0.0, 0.0
        self.host_components(hosted)
        self.delay_s, self.hang_once_in, self.marker = settings.delay_s, settings.hang_once_in, settings.marker
        self.sample_cost_s = settings.sample_cost_s

    def _maybe_hang(self, phase: str) -> None:
        import os
        import time

        if self.hang_once_in == phase and self.marker and os.path.exists(self.marker):
            os.unlink(self.marker)
            time.sleep(3600)

    def learn(self, iteration: int, chunk: int, samples: list[torch.Tensor] | None) -> dict[str, float]:
        import time

        start = time.perf_counter()
        time.sleep(self.delay_s)
        if samples is None:  # the source runs in this process: every source rank's samples, made here
            data = self.hosted("source").make_all(iteration, chunk)
        else:
            data = torch.cat(samples)
        with self.device_turn():
            time.sleep(self.sample_cost_s * len(data) / self.world_size)
            loss = ((self.value - data) ** 2).sum() / self.batch  # this micro-batch's part of the mean
            loss.backward()
            self._loss += float(loss.detach())
            last = chunk == self.chunks - 1
            if last:
                self.opt.step()
                self.opt.zero_grad()
        self._busy += time.perf_counter() - start
        if not last:
            return {}
        out = {"toy/loss": self._loss, "toy/micro_batches": float(self.chunks), "time/learner_busy_s": self._busy}
        self._loss, self._busy = 0.0, 0.0
        return out

    def get(self) -> float:
        self._maybe_hang("evaluate")
        return float(self.value.detach())

    def snapshot(self) -> float:
        self._maybe_hang("save")
        return float(self.value.detach())

    def set(self, value: float) -> None:
        with torch.no_grad():
            self.value.fill_(value)


# ----------------------------------------------------------------------------- the declaration

GRAPH = WorkflowGraph(
    name="toy_mean",
    components=(
        Component("source", "noisy samples of the target", worker=f"{HERE}:Source", section="source",
                  timing="time/source_busy_s"),
        Component("learner", "fits the mean of the samples", holds_model=True, trains=True, worker=f"{HERE}:Learner",
                  section="learner", timing="time/learner_busy_s"),
    ),
    edges=(Edge("samples", "source", "learner", "tensor", kind="p2p"),),
    fusions=(Fusion("source", "learner", "on the learner's devices rank for rank", key="source.fuse_with_learner"),),
)


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


class ToyFlow:
    """The live toy: iteration ``it`` makes samples (unless fused) and takes one learner step on them, the
    samples going from source to learner in the plan's micro-batches."""

    max_staleness = 0
    description = "toy"

    def __init__(self, cfg: ToyConfig, plan: Plan, groups: dict[str, Any], run: Launch) -> None:
        self.cfg, self.timeout = cfg, cfg.fault_tolerance.iteration_timeout_s
        self.fused = plan.fused("source")
        self.chunks = plan.settings["batch"] // plan.settings["micro_batch"]
        self.source, self.learner = groups.get("source"), groups["learner"]
        self.iterations = self.progress_total = cfg.steps
        self._made: dict[int, Any] = {}
        self._done = run.start
        if run.state is not None:
            gather([self.learner.set(run.state["value"])], self.timeout)

    def start(self, it: int, horizon: int) -> None:
        if not self.fused and it not in self._made:
            self._made[it] = [self.source.make(it, k) for k in range(self.chunks)]

    def finish(self, it: int) -> dict[str, float]:
        import time

        made_s, out = 0.0, {}
        made = self._made.pop(it, [None] * self.chunks)
        for k, handle in enumerate(made):
            t0 = time.perf_counter()
            samples = None if handle is None else gather([handle], self.timeout)[0]
            made_s += time.perf_counter() - t0
            out = gather([self.learner.learn(it, k, samples)], self.timeout)[0][0]
        self._done = it + 1
        return {**out, "time/source_busy_s": made_s}

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        return {"time/step": seconds}

    def in_flight(self, it: int) -> bool:
        return False

    def progress(self) -> int:
        return self._done

    def evaluate(self) -> dict[str, float]:
        value = gather([self.learner.get(ranks=[0])], self.timeout, "an evaluation")[0][0]
        return {"eval/error": abs(value - self.cfg.target)}

    def save(self, path: Path) -> dict[str, Any]:
        return {"value": gather([self.learner.snapshot(ranks=[0])], self.timeout, "a checkpoint")[0][0]}

    def summary(self, history: list[dict[str, float]]) -> str:
        return f"toy: {len(history)} iteration(s)"

    def shutdown(self) -> None:
        for group in (self.source, self.learner):
            if group is not None:
                group.shutdown()


def micro_batches(cfg: ToyConfig) -> tuple[int, ...]:
    """Micro-batch sizes worth trying: the whole batch, its half and its quarter."""
    batch = cfg.source.batch
    return tuple(sorted({batch // k for k in (1, 2, 4) if batch % k == 0}))


class ToyWorkflow(Workflow):
    name = "toy_mean"
    schema = ToyConfig
    graph = GRAPH
    help = "fit the mean of noisy samples"
    tunables = (Tunable("micro_batch", "learner.micro_batch", micro_batches),)

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
        # Batch and micro-batch are the plan's, never read back from the config.
        batch, micro = plan.settings["batch"], plan.settings["micro_batch"]
        learner = cfg.learner
        settings = {"source": SourceSettings(batch, micro, cfg.target, cfg.seed, plan["source"].world_size),
                    "learner": LearnerSettings(learner.lr, batch, batch // micro, learner.delay_s,
                                               learner.hang_once_in, learner.marker, learner.sample_cost_s)}
        _, groups = self.launch_groups(plan, executor, run, settings)
        return ToyFlow(cfg, plan, groups, run)

    def iterations(self, cfg: ToyConfig, plan: Plan) -> int:
        return cfg.steps

    def profile_length(self, cfg: ToyConfig, iterations: int) -> dict[str, Any]:
        return {"steps": iterations, "eval_every": 0}

    def edge_bytes(self, cfg: ToyConfig) -> dict[str, float]:
        return {"samples": 4.0}


WORKFLOW = register_workflow(ToyWorkflow())


# ----------------------------------------------------------------------------- the tests


def _config(tmp_path: Path, **overrides: Any) -> ToyConfig:
    data = {"run_dir": str(tmp_path / "run"), "steps": 8, "eval_every": 4, **overrides}
    return from_dict(ToyConfig, data)


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
