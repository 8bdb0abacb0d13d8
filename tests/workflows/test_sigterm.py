"""SIGTERM stops `m2flow train` cleanly: the iteration ends, a checkpoint is written, exit 143, nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_checkpoints_and_exits_143(tmp_path):
    run_dir = tmp_path / "run"
    config = {
        "workflow": "embodied", "placement": "env,rollout,actor: 0",
        "env": {"env_id": "M2flowToy/ContextMatch-v0", "num_envs": 4, "normalize_obs": False,
                "normalize_reward": False},
        "env_worker": {"imports": ["tests.workers.embodied.toy_envs"]},
        "rollout_steps": 32, "total_env_steps": 10_000_000, "checkpoint_every": 1000,
        "algorithm": {"epochs": 1, "minibatch_size": 64}, "policy": {"hidden_sizes": [16]},
        "run_dir": str(run_dir), "metrics": {"sinks": ["jsonl"]},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "m2flow", "train", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run logged no iteration in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, (out, err)
    assert "Aborted" not in err and "Stack trace" not in err and "Traceback" not in err, err
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert checkpoints, "no checkpoint at the stop"
    state = json.loads((checkpoints[-1] / "trainer_state.json").read_text())
    rows = metrics.read_text().splitlines()
    assert state["next_step"] == len(rows)  # the checkpoint is the iteration the run stopped after
    deadline = time.monotonic() + 60
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(proc.pid), "processes of the run are still running"
