"""A run of any workflow, written once: resume, plan, launch, loop, checkpoints, restarts, result.

``Run`` is one attempt (a config under a given Plan, its ``plan_file``'s, or the one its placement
gives) as a context manager: inside the block
``run.flow`` is the live system and ``run.plan`` the plan it applies (tests inspect workers between
iterations). A worker that dies or hangs ends the attempt; the next one resumes the newest
checkpoint this run wrote (never another run's), or starts over, and the metric rows logged after
that point are dropped, so every step is logged once: ``attempts`` makes the attempt that
``restarts.run_with_restarts`` repeats (``autoplan.entry.train`` runs them, the one way to train).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.driver.checkpoints import (
    CHECKPOINTS,
    RunIdentity,
    checkpoint_path,
    find_checkpoint,
    prune_checkpoints,
    read_state,
    truncate_metrics,
    write_state,
)
from m2flow.driver.loop import Cadence, train_loop
from m2flow.driver.scaffold import RunScaffold
from m2flow.driver.stop import EXIT_TERMINATED
from m2flow.driver.workflow import Flow, Launch, Workflow
from m2flow.planner import Plan, PlanError
from m2flow.runtime.cluster import Cluster
from m2flow.runtime.placement import executor_kind

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
"""The run's config, saved into every checkpoint (evaluation and resume read it)."""


@dataclass
class TrainResult:
    """What a run did: its plan, the metrics of every iteration, its evaluations and last checkpoint."""

    run_dir: Path
    workflow: str = ""
    mode: str = ""
    plan: Plan | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    """(progress step, eval metrics) of every evaluation, the baseline before training first"""
    episodes: list[tuple[int, float]] = field(default_factory=list)
    """(progress step when reported, raw return) of every finished episode, for workflows with episodes"""
    last_checkpoint: Path | None = None
    startup_s: float = 0.0
    """seconds from the start of the attempt until the workers were ready (Ray, processes, models)"""
    loop_s: float = 0.0
    """seconds in the training loop itself"""
    stopped: bool = False
    """ended early by SIGTERM or re-planning (after a whole iteration, checkpointed when checkpoints are on)"""
    restarts: int = 0
    """times the flow was restarted after a worker died or hung"""


def identity_of(workflow: Workflow, cfg: Any) -> RunIdentity:
    """A new run's identity: the config without the keys that only say how or how long it runs, and the seed."""
    from m2flow.driver.run_config import RUN_KEYS
    from m2flow.planner.profile_file import config_hash

    ignore = (*RUN_KEYS, "seed", *workflow.execution_keys())
    return RunIdentity.new(workflow.name, config_hash(to_dict(cfg), ignore=ignore), cfg.seed)


def load_plan_file(workflow: Workflow, path: str) -> Plan:
    """The plan saved at ``path``, checked against the workflow's graph; bad files raise PlanError naming them."""
    if not Path(path).is_file():
        raise PlanError(f"plan_file: {path} does not exist")
    return Plan.load(Path(path)).validate(workflow.graph)


class Run:
    """One attempt of a run, as a context manager: prepares, resumes, plans, launches; shuts down on exit."""

    def __init__(self, workflow: Workflow, cfg: Any, cluster: Cluster | None = None, restarts: int = 0,
                 identity: RunIdentity | None = None, plan: Plan | None = None) -> None:
        self.workflow, self.cfg, self.restarts = workflow, cfg, restarts
        self.run_dir = Path(cfg.run_dir)
        self.identity = identity or identity_of(workflow, cfg)
        # The plan that runs: the one given (the search's choice), else the plan file's, else the workflow
        # plans the config once the executor knows the cluster's layout.
        self.fixed_plan = plan.validate(workflow.graph) if plan is not None else (
            load_plan_file(workflow, cfg.plan_file) if cfg.plan_file else None)
        # The executor is the Plan's when the Plan is known; else the one the placement's Plan will have (the
        # executor's cluster gives the layout the config is planned on).
        kind = self.fixed_plan.executor if self.fixed_plan is not None else executor_kind(cfg.placement)
        self.scaffold = RunScaffold(cfg.run_dir, executor=kind, cluster_config=cfg.cluster, cluster=cluster,
                                    trace=cfg.trace)
        self.flow: Flow | None = None
        self.plan: Plan | None = None
        self.start = 0
        self.started = time.perf_counter()

    def __enter__(self) -> Run:
        cfg = self.cfg
        self.scaffold.__enter__()
        try:
            prepared = self.workflow.prepare(cfg, self.run_dir)
            # A restart takes only this run's own checkpoints; the first attempt, what ``resume`` asks for.
            resume = "auto" if self.restarts else cfg.resume
            checkpoint = find_checkpoint(resume, self.run_dir, self.identity, same_run=bool(self.restarts))
            state: dict[str, Any] | None = None
            if checkpoint is not None:
                state = read_state(checkpoint)
                self.identity = self.identity.continuing(state.get("identity"))
                self.start = int(state["next_step"])
                truncate_metrics(self.run_dir, int(state.get("progress", self.start)))
                log.info("resuming from %s at iteration %d", checkpoint, self.start)
            elif self.restarts:
                # Starting over: every row logged so far comes again, the baseline evaluation's at step 0 too
                # (keeping rows up to step 0 logged that one twice).
                truncate_metrics(self.run_dir, -1)
            else:
                _set_aside_metrics(self.run_dir, self.identity.run_id)
            executor = self.scaffold.executor()
            plan = self.fixed_plan or self.workflow.plan(cfg, executor.layout)
            self.plan = self.scaffold.adopt(plan)
            launch = Launch(self.run_dir, self.scaffold.trace_dir, prepared, checkpoint,
                            state.get("flow") if state else None, self.start, uuid.uuid4().hex[:8])
            self.flow = self.workflow.launch(cfg, plan, executor, launch)
        except BaseException as e:
            self.__exit__(type(e), e, None)
            raise
        return self

    def save(self, next_step: int) -> Path:
        """A checkpoint before iteration ``next_step``: the workers' state, the config, then the driver's marker."""
        from m2flow.config.loader import save_config

        assert self.flow is not None
        path = checkpoint_path(self.run_dir, next_step)
        flow_state = self.flow.save(path)
        save_config(self.cfg, path / CONFIG_FILE, workflow=self.workflow.name)
        write_state(path, {"workflow": self.workflow.name, "next_step": next_step, "progress": self.flow.progress(),
                           "identity": self.identity.to_dict(), "flow": flow_state})
        log.info("checkpoint %s", path)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        return path

    def train(self, watch: Callable[[int, dict[str, float]], bool] | None = None) -> TrainResult:
        """Run the remaining iterations; metrics go to the configured sinks (``watch``: see ``train_loop``)."""
        from m2flow.metrics import MetricsLogger

        flow, cfg = self.flow, self.cfg
        assert flow is not None and self.plan is not None, "use Run as a context manager"
        result = TrainResult(self.run_dir, self.workflow.name, self.plan.mode, self.plan, restarts=self.restarts,
                             startup_s=time.perf_counter() - self.started)
        cadence = Cadence(flow.iterations, cfg.eval_every, cfg.checkpoint_every)
        with MetricsLogger(self.run_dir, cfg.metrics, total_steps=flow.progress_total,
                           description=f"{self.workflow.name} ({flow.description})" if flow.description
                           else self.workflow.name, run_config=to_dict(cfg)) as logger:
            t0 = time.perf_counter()
            outcome = train_loop(flow, cadence, self.start, logger, self.save, stop=self.scaffold.stop, watch=watch,
                                 constants={"faults/restarts": float(self.restarts)})
            result.loop_s = time.perf_counter() - t0
            summary = flow.summary(outcome.history)
            if self.restarts:
                summary += f"; {self.restarts} restart(s) after a worker died or hung"
            logger.print(f"{summary}; {result.loop_s:.1f}s; run directory {self.run_dir}")
        result.history, result.evaluations, result.stopped = outcome.history, outcome.evaluations, outcome.stopped
        result.episodes = list(getattr(flow, "episodes", []))
        if result.episodes:
            (self.run_dir / "episodes.json").write_text(json.dumps(result.episodes))
        done = sorted((self.run_dir / CHECKPOINTS).glob("step_*"))
        result.last_checkpoint = done[-1] if done else None
        return result

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.flow is not None:
                self.flow.shutdown()
                self.flow = None
        finally:
            self.scaffold.__exit__(*exc)


def _set_aside_metrics(run_dir: Path, run_id: str) -> None:
    """A new run in a directory that holds another run's metrics moves them aside, so no curve mixes runs."""
    from m2flow.metrics.sinks import METRICS_FILE

    path = run_dir / METRICS_FILE
    if path.is_file() and path.stat().st_size:
        aside = path.with_name(f"{path.stem}.before-{run_id}{path.suffix}")
        os.replace(path, aside)
        log.warning("a new run in %s: the metrics of the run before it moved to %s", run_dir, aside.name)


def attempts(workflow: Workflow, cfg: Any, cluster: Cluster | None = None,
             watch: Callable[[int, dict[str, float]], bool] | None = None,
             plan: Plan | None = None) -> Callable[[int], TrainResult]:
    """``attempt(restarts)``: one ``Run`` of ``cfg`` (under ``plan`` when given) through the loop, for
    ``run_with_restarts``; each attempt goes on under the id of the run the one before resumed."""
    identity = [identity_of(workflow, cfg)]

    def attempt(restarts: int) -> TrainResult:
        run = Run(workflow, cfg, cluster, restarts, identity[0], plan=plan)
        try:
            with run:
                return run.train(watch)
        finally:
            identity[0] = run.identity  # a resumed run goes on under the id of the run it continues

    return attempt


def exit_code(result: TrainResult) -> int:
    """The process exit status of a finished run: 143 when SIGTERM stopped it, else 0."""
    return EXIT_TERMINATED if result.stopped else 0
