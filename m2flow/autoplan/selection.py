"""The plan ``placement: auto`` runs: the search's best candidate under a cost model, the runner-up,
and the record of the choice (and of every re-planning decision) in ``RUN_DIR/auto.json``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m2flow.config.errors import ConfigError
from m2flow.autoplan.plan_context import PlanContext
from m2flow.planner.choice import PlanChoice

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
    choice: PlanChoice = field(init=False)
    """the ``PlanChoice`` that runs: the candidate's (``placement: local`` for a plan on one device)"""
    plan: Any = field(init=False)
    """the Plan that runs: the candidate's, as the search built it"""
    cfg: Any = field(init=False)
    """the config it runs with: the one given (the Plan, not the config, says how it runs)"""
    overrides: dict[str, Any] = field(init=False)
    """the config overrides of ``choice`` (``Workflow.overrides``), as logged and recorded for the user to
    read or rerun; never planned from"""

    def __post_init__(self) -> None:
        choice, plan = self.best.choice, self.best.plan
        if _one_device(plan):
            # Every component on device 0, one rank each, is the plan the local executor runs in this
            # process: the same ranks and turns without starting Ray.
            choice = choice.at("local")
            plan = self.ctx.build(choice)
        self.choice, self.plan = choice, plan
        self.overrides = self.ctx.spec.overrides(choice)
        self.cfg = self.ctx.given

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
            return None if c is None else {"mode": c.shape.mode, "choice": c.choice.to_json(),
                                           "overrides": self.ctx.spec.overrides(c.choice),
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


def choose(ctx: PlanContext, cost: Any, profile: Path | None = None,
           keep: Callable[[Any], bool] = lambda cand: True) -> Choice:
    """The fastest plan under ``cost`` that ``keep`` accepts, with the runner-up."""
    from m2flow.planner.search import search

    result = search(ctx.space, cost, ctx.devices, top=5, build_plan=ctx.build)
    ranked = [c for c in result.ranked if keep(c)]
    if not ranked:
        shown = ([result.best_rejected] if result.best_rejected is not None else []) + result.rejected[:1]
        why = "; ".join(f"{c.placement!r}: {c.rejected}" for c in shown)
        raise ConfigError("placement", f"auto: no plan fits on {ctx.devices} device(s){': ' + why if why else ''}")
    return Choice(ctx, cost, ranked[0], ranked[1] if len(ranked) > 1 else None, result.collocated, profile)


def write_record(run_dir: Path, record: dict[str, Any], replan: dict[str, Any] | None = None) -> None:
    """Save the choice (or add a re-planning decision) to ``RUN_DIR/auto.json``."""
    path = run_dir / AUTO_FILE
    run_dir.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if replan is not None and path.is_file() else {**record, "replans": []}
    if replan is not None:
        data.setdefault("replans", []).append(replan)
    path.write_text(json.dumps(data, indent=1, default=str))


