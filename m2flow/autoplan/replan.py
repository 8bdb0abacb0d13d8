"""Re-planning during a ``placement: auto`` run: watch the measured component times, and at a
checkpoint boundary switch to another plan when the corrected prediction says it pays.

``ReplanMonitor`` is the loop's ``watch``: it is shown every iteration's metrics. It feeds each
component's busy seconds (the workflow's timing metrics) to a ``planner.drift.DriftDetector``
against the chosen plan's simulated busy seconds, and logs when a component starts to drift.
While one drifts, at the next iteration after which a checkpoint is saved, it re-plans: the
cost model with every component scaled by its measured / predicted ratio, the current plan
simulated under it, the search run again (among plans a checkpoint of the current one can be
resumed under). It switches when the time saved over the remaining iterations exceeds the
switch cost (the start-up of the new plan's groups and one iteration), by ending the loop there;
``entry.train`` resumes from that checkpoint under the new plan. Otherwise it keeps the
plan and takes the corrected predictions as its new reference, so the same drift does not ask
again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from m2flow.planner.drift import DriftDetector, rescaled, worth_switching
from m2flow.planner.simulate import Simulator

log = logging.getLogger(__name__)


class ReplanMonitor:
    """The ``watch`` of one run segment under one plan."""

    def __init__(self, choice: Any, switches_left: int) -> None:
        self.choice = choice
        ctx = choice.ctx
        self.cfg, self.spec = choice.cfg, ctx.spec
        self.timings = ctx.spec.graph.timings()
        self.plan = choice.plan
        self.total = self.spec.iterations(self.cfg, self.plan)
        auto = self.cfg.auto
        self.window = auto.drift_window
        self.detector = self._detector(choice.best.result.component_time)
        self.switch: Any = None
        """the ``selection.Choice`` to switch to, once decided"""
        self.cost = choice.cost
        self.blocked = ""
        if not auto.replan:
            self.blocked = "auto.replan is off"
        elif not self.cfg.checkpoint_every:
            self.blocked = "re-planning switches at a checkpoint and checkpoint_every is 0"
        elif switches_left <= 0:
            self.blocked = f"auto.max_replans ({auto.max_replans}) switches made"
        self._told = False

    def _detector(self, predicted: dict[str, float]) -> DriftDetector:
        auto = self.cfg.auto
        return DriftDetector(predicted, auto.drift_threshold, auto.drift_window, warmup=1)

    def __call__(self, it: int, metrics: dict[str, float]) -> bool:
        measured = {c: float(metrics[k]) for c, k in self.timings.items() if k in metrics}
        for drift in self.detector.observe(measured):
            log.warning("auto: drift at iteration %d: %s", it, drift.describe(self.window))
        if not self.detector.drifting:
            return False
        if self.blocked:
            if not self._told:
                log.warning("auto: not re-planning: %s", self.blocked)
                self._told = True
            return False
        done = it + 1
        if done % self.cfg.checkpoint_every or done >= self.total:
            return False  # the switch waits for a checkpoint boundary (and is pointless after the last iteration)
        return self._replan(it, done)

    def _replan(self, it: int, done: int) -> bool:
        from m2flow.autoplan import selection

        ctx = self.choice.ctx
        ratios = self.detector.ratios()
        cost = rescaled(self.cost, ratios)
        sim = Simulator(ctx.space.graph, ctx.space.workload, cost)
        current = sim.simulate(self.choice.best.setup)
        resumable = self.spec.resumable

        def keep(cand: Any) -> bool:
            return cand.plan is not None and resumable(self.plan, cand.plan)

        new = selection.choose(ctx, cost, self.choice.profile, keep)
        remaining = self.total - done
        startup = sum(cost.component(c).startup_s for c in ctx.space.running)
        decision = worth_switching(current.iteration_time, new.seconds, remaining, startup + current.iteration_time)
        same = new.best.choice == self.choice.best.choice
        scaled = ", ".join(f"{c} x{r:.2f}" for c, r in ratios.items())
        log.warning("auto: re-planned after iteration %d with measured times (%s): running plan %.4g s/iteration, "
                    "best %.4g s/iteration%s; %s", it, scaled, current.iteration_time, new.seconds,
                    " (the running one)" if same else f" (placement={new.best.placement!r})", decision.describe())
        record = {"iteration": it, "ratios": ratios, "current_s": current.iteration_time, "best_s": new.seconds,
                  "best": ctx.spec.overrides(new.best.choice), "best_choice": new.best.choice.to_json(),
                  "gain_s": decision.gain_s, "switch_cost_s": decision.cost_s,
                  "switched": decision.switch and not same}
        selection.write_record(Path(self.cfg.run_dir), {}, record)
        if decision.switch and not same:
            self.switch = new
            return True
        # Keep the plan; the corrected model is the reference from here, so this drift is not asked about again.
        self.cost = cost
        self.detector = self._detector(current.component_time)
        return False
