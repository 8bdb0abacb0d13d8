"""The one way to train any workflow: from the command (or a script) to the driver's loop.

``train(workflow, cfg)`` runs a config under its Plan: the one its placement or ``plan_file`` gives,
or, with ``placement: auto``, the one the search chooses and built (``auto.resolve``), run as it is,
which may be switched at a checkpoint when the measured times drift (``replan.ReplanMonitor``). Each Plan's run is attempts of
``driver.run.Run`` that ``run_with_restarts`` repeats after a worker died or hung.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from m2flow.driver.restarts import run_with_restarts
from m2flow.driver.run import TrainResult, attempts, exit_code
from m2flow.driver.run_config import is_auto
from m2flow.driver.workflow import Workflow

log = logging.getLogger(__name__)

Watch = Callable[[int, dict[str, float]], bool]


def train(workflow: Workflow, cfg: Any, cluster: Any = None, watch: Watch | None = None) -> TrainResult:
    """Run (or resume) ``cfg`` of ``workflow``; ``cluster`` reuses a running Ray (else one starts). With
    ``placement: auto`` the planner chooses the Plan first and may switch it at a checkpoint. A worker that
    dies or hangs restarts the flow from this run's newest checkpoint (``fault_tolerance``); ``watch(it,
    metrics)`` returning True stops the loop after iteration ``it``."""
    if not is_auto(cfg.placement):
        return run_with_restarts(attempts(workflow, cfg, cluster, watch), cfg.run_dir, cfg.fault_tolerance)
    from m2flow.autoplan.auto import resolve
    from m2flow.autoplan.replan import ReplanMonitor

    choice = resolve(workflow, cfg)
    run_cfg = cfg
    history: list[dict[str, float]] = []
    for switches in range(cfg.auto.max_replans + 1):
        monitor = ReplanMonitor(choice, switches_left=cfg.auto.max_replans - switches)

        def watched(it: int, metrics: dict[str, float], monitor: ReplanMonitor = monitor) -> bool:
            stop = monitor(it, metrics)
            return bool(watch(it, metrics)) or stop if watch is not None else stop

        result = run_with_restarts(attempts(workflow, run_cfg, cluster, watched, choice.plan), cfg.run_dir,
                                   cfg.fault_tolerance)
        history += result.history
        if monitor.switch is None:
            result.history = history
            return result
        choice = monitor.switch
        run_cfg = replace(cfg, resume="auto")
        log.info("auto: restarting from the newest checkpoint with placement=%s", json.dumps(choice.plan.placement))
    raise AssertionError("unreachable: the last run has no switches left")


def run(workflow: Workflow, cfg: Any) -> int:
    """``m2flow train``: run the config; the process exit status."""
    return exit_code(train(workflow, cfg))
