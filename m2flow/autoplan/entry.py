"""Running a workflow's config, whichever way it is planned: ``placement: auto`` searches first (and may
re-plan), any other placement or a ``plan_file`` goes straight to the driver."""

from __future__ import annotations

from typing import Any

from m2flow.driver.run import TrainResult, exit_code
from m2flow.driver.run import train as train_planned
from m2flow.driver.run_config import is_auto
from m2flow.driver.workflow import Workflow


def train(workflow: Workflow, cfg: Any, cluster: Any = None, watch: Any = None) -> TrainResult:
    """Run (or resume) ``cfg`` of ``workflow``; with ``placement: auto`` the planner chooses the plan first."""
    if is_auto(cfg.placement):
        from m2flow.autoplan.auto import train_auto

        return train_auto(workflow, cfg, cluster)
    return train_planned(workflow, cfg, cluster, watch)


def run(workflow: Workflow, cfg: Any) -> int:
    """``m2flow train``: run the config; the process exit status."""
    return exit_code(train(workflow, cfg))
