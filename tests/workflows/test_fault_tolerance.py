"""A worker killed with SIGKILL mid-run: the flow restarts from the newest checkpoint and completes,
every iteration logged once; a hung worker is caught by its deadline; other errors are not retried."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from m2flow.runtime.errors import WorkerError, WorkerHungError, worker_died
from m2flow.driver.run_config import FaultToleranceConfig
from m2flow.driver.restarts import run_with_restarts
from tests.processes import rank_pid
from tests.ray_session import shared_cluster
from tests.workflows.reasoning.setup import toy_config as reasoning_config
from tests.workflows.embodied.setup import toy_config as embodied_config

pytestmark = pytest.mark.timeout(900)


def _rows(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _kill_when(run_dir: str, rows: int, group_prefix: str, killed: list[int]) -> threading.Thread:
    """A thread that SIGKILLs rank 0 of the group named ``group_prefix-*`` once ``rows`` iterations are logged."""
    def watch() -> None:
        deadline = time.monotonic() + 600
        while len(_rows(run_dir)) < rows:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        pid = rank_pid(group_prefix)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_embodied_survives_a_killed_actor(tmp_path):
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

    cfg = embodied_config(tmp_path, checkpoint_every=2, total_env_steps=8 * 512)
    killed: list[int] = []
    watcher = _kill_when(cfg.run_dir, 3, "actor", killed)
    result = train(EMBODIED, cfg, cluster=shared_cluster())
    watcher.join(timeout=5)
    assert killed, "the actor was never killed"
    assert result.restarts == 1
    rows = _rows(cfg.run_dir)
    assert [r["env/total_steps"] for r in rows] == [512.0 * (i + 1) for i in range(8)]  # each once, none lost
    assert rows[-1]["faults/restarts"] == 1.0


def test_reasoning_survives_a_killed_actor(tmp_path):
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING

    cfg = reasoning_config(tmp_path, "actor,rollout,inference,reward: 0", steps=6, checkpoint_every=2)
    killed: list[int] = []
    watcher = _kill_when(cfg.run_dir, 3, "actor", killed)
    result = train(REASONING, cfg, shared_cluster())
    watcher.join(timeout=5)
    assert killed and result.restarts == 1
    rows = _rows(cfg.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["rollout/responses_count"] == 64 for r in rows)
    assert rows[-1]["faults/restarts"] == 1.0


def test_deaths_are_recognised_whichever_side_notices():
    assert worker_died(WorkerHungError("g", 0, "n", "late"))
    assert worker_died(WorkerError("g", 0, "n", "peer gone", exc_type="PeerDiedError"))
    assert not worker_died(WorkerError("g", 0, "n", "bad value", exc_type="ValueError"))
    assert not worker_died(ValueError("x"))


def test_restarts_stop_at_the_limit_and_other_errors_are_not_retried(tmp_path):
    calls = []

    def dies(restarts):
        calls.append(restarts)
        raise WorkerHungError("g", 0, "n", "late")

    with pytest.raises(WorkerHungError):
        run_with_restarts(dies, tmp_path, FaultToleranceConfig(max_restarts=2))
    assert calls == [0, 1, 2]

    def fails(restarts):
        calls.append(restarts)
        raise ValueError("a bug, not a death")

    calls.clear()
    with pytest.raises(ValueError):
        run_with_restarts(fails, tmp_path, FaultToleranceConfig(max_restarts=2))
    assert calls == [0]


def test_a_hung_worker_is_caught_by_its_deadline(tmp_path):
    from m2flow.runtime import Worker, WorkerGroup
    from m2flow.runtime.waiting import gather

    class Sleeper(Worker):
        def nap(self, seconds: float) -> float:
            time.sleep(seconds)
            return seconds

    group = WorkerGroup(Sleeper, shared_cluster(), f"sleeper-{os.getpid()}", placement="0")
    try:
        start = time.monotonic()
        with pytest.raises(WorkerHungError, match=r"nap\(\) gave no result within 1s") as info:
            gather([group.nap(60.0)], timeout=1.0)
        assert time.monotonic() - start < 10
        assert info.value.group.startswith("sleeper") and info.value.rank == 0
    finally:
        group.shutdown()
