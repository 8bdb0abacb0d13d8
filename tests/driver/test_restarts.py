"""Restarts never mix runs, log every step once, and catch a hang wherever the driver waits: a worker
killed or stopped mid-run, in a run directory that holds another run's checkpoints or none of its own.
The toy workflow of ``test_toy_workflow`` runs on Ray; its learner is the worker that fails."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from m2flow.driver.checkpoints import read_state
from tests.driver.test_toy_workflow import _config, _train
from tests.processes import rank_pid
from tests.ray_session import shared_cluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

PLACEMENT = "source: 0, learner: 1"


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _kill_learner_after(run_dir: Path, rows: int, killed: list[int], after_old_run: bool = False) -> threading.Thread:
    """SIGKILL the learner's process once ``rows`` iterations of this run are logged (``after_old_run``: once
    the rows of the run before it were moved aside)."""
    def watch() -> None:
        deadline = time.monotonic() + 300
        while (after_old_run and not list(run_dir.glob("metrics.before-*.jsonl"))) or \
                len([r for r in _rows(run_dir) if "toy/loss" in r]) < rows:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        pid = rank_pid("learner")
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in _rows(run_dir) if "toy/loss" in r]


def _losses(run_dir: Path) -> list[float]:
    return [r["toy/loss"] for r in _rows(run_dir) if "toy/loss" in r]


def test_a_restart_resumes_its_own_checkpoint_never_an_older_runs(tmp_path):
    old = _config(tmp_path, placement=PLACEMENT, seed=0, checkpoint_every=2, eval_every=0)
    _train(old, shared_cluster())
    assert (tmp_path / "run" / "checkpoints" / "step_000008").is_dir()  # the old run's newest checkpoint
    reference = _train(_config(tmp_path / "ref", placement=PLACEMENT, seed=1, eval_every=0), shared_cluster())
    new = _config(tmp_path, placement=PLACEMENT, seed=1, checkpoint_every=2, eval_every=0,
                  learner={"delay_s": 0.2})
    killed: list[int] = []
    watcher = _kill_learner_after(tmp_path / "run", 3, killed, after_old_run=True)
    result = _train(new, shared_cluster())
    watcher.join(timeout=5)
    assert killed and result.restarts == 1
    # Every step of the new run once, computed as an uninterrupted run of the new seed computes it.
    assert _steps(tmp_path / "run") == list(range(1, 9))
    assert _losses(tmp_path / "run") == [h["toy/loss"] for h in reference.history]
    assert read_state(tmp_path / "run" / "checkpoints" / "step_000008")["identity"]["seed"] == 1
    assert list((tmp_path / "run").glob("metrics.before-*.jsonl")), "the old run's metrics were not kept"


def test_resume_auto_and_a_death_before_any_checkpoint_logs_each_step_once(tmp_path):
    cfg = _config(tmp_path, placement=PLACEMENT, resume="auto", eval_every=0, learner={"delay_s": 0.2})
    killed: list[int] = []
    watcher = _kill_learner_after(tmp_path / "run", 3, killed)
    result = _train(cfg, shared_cluster())
    watcher.join(timeout=5)
    assert killed and result.restarts == 1
    assert _steps(tmp_path / "run") == list(range(1, 9))


@pytest.mark.parametrize("phase", ["evaluate", "save"])
def test_a_hang_in_an_evaluation_or_a_checkpoint_is_caught_and_the_run_restarts(tmp_path, phase):
    marker = tmp_path / "armed"
    marker.touch()
    cfg = _config(tmp_path, placement=PLACEMENT, eval_every=4, checkpoint_every=4,
                  fault_tolerance={"iteration_timeout_s": 3.0},
                  learner={"hang_once_in": phase, "marker": str(marker)})
    start = time.monotonic()
    result = _train(cfg, shared_cluster())
    assert not marker.exists() and result.restarts == 1  # it hung once, was caught, and the run went on
    assert time.monotonic() - start < 120
    assert _steps(tmp_path / "run") == list(range(1, 9))
