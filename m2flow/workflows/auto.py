"""``placement: auto``: the run takes (or makes) a profile, searches the plans, runs the fastest, and
re-plans when the measured component times drift from the predicted ones.

The profile is ``auto.profile``, else ``RUN_DIR/profile.json`` (where ``m2flow profile`` writes by
default). One that is missing, or refused by the profile checks (another machine, another torch
or m2flow, another config), is made again by profiling here, saying why. The chosen plan, its
predicted time and the runner-up are logged and saved in ``RUN_DIR/auto.json``; re-planning
(``replan.py``) appends each decision there.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from m2flow.config.errors import ConfigError
from m2flow.workflows.plan_context import PlanContext

log = logging.getLogger(__name__)

AUTO_FILE = "auto.json"


@dataclass
class Choice:
    """The plan ``placement: auto`` runs, how it was chosen, and against what."""

    ctx: PlanContext
    cost: Any
    """the ``CostModel`` it was chosen under"""
    best: Any
    """the chosen ``search.Candidate``"""
    runner_up: Any = None
    collocated: Any = None
    profile: Path | None = None
    cfg: Any = field(init=False)
    """the config that runs it: the candidate's overrides (a concrete placement among them) applied"""
    overrides: dict[str, Any] = field(init=False)
    """the overrides ``cfg`` was made with (``placement: local`` for a plan on one device)"""

    def __post_init__(self) -> None:
        overrides = dict(self.best.overrides)
        if _one_device(self.best.plan):
            # Every component on device 0, one rank each, is the plan the local executor runs in this
            # process: the same ranks and turns without starting Ray.
            overrides["placement"] = "local"
        self.overrides = overrides
        self.cfg = self.ctx.configure(overrides)

    @property
    def seconds(self) -> float:
        return float(self.best.result.iteration_time)

    def describe(self) -> list[str]:
        """Lines saying which plan was chosen and why."""
        best = self.best
        res = best.result
        use = " ".join(f"{k}={json.dumps(v)}" for k, v in self.overrides.items())
        lines = [f"auto: chose a {best.shape.mode} plan, predicted {res.iteration_time:.4g} s/iteration "
                 f"(bottleneck {res.bottleneck}): {use}"]
        if self.runner_up is not None:
            r = self.runner_up
            lines.append(f"auto: runner-up {r.shape.mode}, {r.result.iteration_time:.4g} s/iteration "
                         f"({r.seconds_per_item / best.seconds_per_item - 1:+.1%}): placement={json.dumps(r.placement)}")
        if self.collocated is not None and self.collocated is not best:
            lines.append(f"auto: the fastest collocated plan is predicted at {self.collocated.result.iteration_time:.4g} "
                         f"s/iteration ({self.collocated.seconds_per_item / best.seconds_per_item:.2f}x the chosen one)")
        return lines

    def record(self) -> dict[str, Any]:
        def one(c: Any) -> dict[str, Any] | None:
            return None if c is None else {"mode": c.shape.mode, "overrides": c.overrides,
                                           "seconds_per_iteration": c.result.iteration_time,
                                           "bottleneck": c.result.bottleneck}
        return {"profile": str(self.profile) if self.profile else None, "chosen": one(self.best),
                "runs_with": self.overrides,
                "runner_up": one(self.runner_up), "collocated": one(self.collocated)}


def _one_device(plan: Any) -> bool:
    if plan is None:
        return False
    return all(c.placement.world_size == 1 and c.placement.devices <= {(0, 0)} for c in plan.components)


def profile_path(cfg: Any) -> Path:
    """Where a run of ``cfg`` with ``placement: auto`` takes its profile from (and writes it to)."""
    return Path(cfg.auto.profile) if cfg.auto.profile else Path(cfg.run_dir) / "profile.json"


def load_or_profile(ctx: PlanContext) -> tuple[Any, Path]:
    """The cost model of the config's profile, profiling first when there is none that may be used."""
    from m2flow.planner.profile import ProfileError, load_profile
    from m2flow.workflows.profiler import Profiler, ProfileWriteError

    cfg, name = ctx.cfg, ctx.spec.name
    path = profile_path(cfg)
    try:
        cost = load_profile(path, name, ctx.config_hash())
        log.info("auto: using the profile %s", path)
        return cost, path
    except ProfileError as e:
        if path.exists():
            log.warning("auto: %s; profiling again", e)
        else:
            log.info("auto: no profile at %s; profiling each component (a few short runs)", path)
    with tempfile.TemporaryDirectory(prefix="m2flow-profile-") as work:
        try:
            Profiler(ctx, iterations=cfg.auto.profile_iterations, max_devices=cfg.auto.profile_devices,
                     work_dir=Path(work), say=log.info).run(path)
        except ProfileWriteError as e:
            raise ConfigError("auto.profile", str(e)) from None
    return load_profile(path, name, ctx.config_hash()), path


def choose(ctx: PlanContext, cost: Any, profile: Path | None = None,
           keep: Callable[[Any], bool] = lambda cand: True) -> Choice:
    """The fastest plan under ``cost`` that ``keep`` accepts, with the runner-up."""
    from m2flow.planner.search import search

    result = search(ctx.space, cost, ctx.devices, top=5, plan_fn=ctx.spec.plan, configure=ctx.configure,
                    layout=ctx.layout)
    ranked = [c for c in result.ranked if keep(c)]
    if not ranked:
        why = "; ".join(f"{c.placement!r}: {c.rejected}" for c in result.rejected[:2])
        raise ConfigError("placement", f"auto: no plan fits on {ctx.devices} device(s){': ' + why if why else ''}")
    return Choice(ctx, cost, ranked[0], ranked[1] if len(ranked) > 1 else None, result.collocated, profile)


def resolve(spec: Any, cfg: Any) -> Choice:
    """Profile (or load the profile of) ``cfg``, search, log the choice; returns it."""
    ctx = PlanContext(spec, cfg)
    cost, path = load_or_profile(ctx)
    choice = choose(ctx, cost, path)
    fits = ", ".join(f"{c} {cost.component(c).fit_error:.1%}" for c in ctx.space.running)
    log.info("auto: searched the plans of %d device(s) from %s (fit error %s)", ctx.devices, path, fits)
    for line in choice.describe():
        log.info("%s", line)
    write_record(Path(cfg.run_dir), choice.record())
    return choice


def write_record(run_dir: Path, record: dict[str, Any], replan: dict[str, Any] | None = None) -> None:
    """Save the choice (or add a re-planning decision) to ``RUN_DIR/auto.json``."""
    path = run_dir / AUTO_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if replan is not None and path.is_file() else {**record, "replans": []}
    if replan is not None:
        data.setdefault("replans", []).append(replan)
    path.write_text(json.dumps(data, indent=1, default=str))


def train_auto(workflow: str, cfg: Any, cluster: Any = None) -> Any:
    """Run ``cfg`` (``placement: auto``): choose, run, and switch plans at a checkpoint when it pays."""
    from m2flow.workflows.registry import get_workflow
    from m2flow.workflows.replan import ReplanMonitor

    spec = get_workflow(workflow)
    choice = resolve(spec, cfg)
    run_cfg = choice.cfg
    history: list[dict[str, float]] = []
    for switches in range(cfg.auto.max_replans + 1):
        monitor = ReplanMonitor(choice, switches_left=cfg.auto.max_replans - switches)
        result = spec.auto.train(run_cfg, cluster, monitor)
        history += result.history
        if monitor.switch is None:
            result.history = history
            return result
        choice = monitor.switch
        run_cfg = replace(choice.cfg, resume="auto")
        log.info("auto: restarting from the newest checkpoint with placement=%s", json.dumps(run_cfg.placement))
    raise AssertionError("unreachable: the last run has no switches left")
