"""After kill -9 of a driver, nothing of its local Ray (agents, raylet, GCS, workers) or of its other
children stays alive; a run whose driver and watchdog were both killed is cleaned up by the next start.

The first tests use a stand-in driver (a Python process with a child in a session of its own, as Ray's
agents are once the raylet is gone); the last one a real driver with a local Ray and a worker group.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from m2flow.runtime import cluster as cluster_mod
from m2flow.runtime import ray_watchdog
from m2flow.runtime.ray_watchdog import descendants, start_time, sweep_orphans

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 10.0

STAND_IN = textwrap.dedent("""
    import os, subprocess, sys, time
    from m2flow.runtime import ray_watchdog
    marker = ray_watchdog.new_marker()
    os.environ[ray_watchdog.ENV_VAR] = marker
    watchdog = ray_watchdog.start_watchdog(marker)
    # Like Ray's agents: a process of its own session that would outlive this one.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    time.sleep(2 * ray_watchdog.SCAN_S)  # the watchdog has recorded the child
    print(watchdog.pid, child.pid, flush=True)
    if sys.argv[1] == "exit":
        ray_watchdog.stop_watchdog(watchdog)
        sys.exit(0)
    time.sleep(300)
""")


def _start(script: str, *args: str) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, [int(p) for p in line.split()]


def _left(processes: dict[int, int], within_s: float = GONE_WITHIN_S) -> dict[int, int]:
    """The processes (pid: start time) still running after up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        left = {p: t for p, t in processes.items() if start_time(p) == t}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_the_children_of_a_killed_driver_are_stopped(tmp_path):
    driver, (watchdog, child) = _start(STAND_IN, "hang")
    recorded = {child: start_time(child), watchdog: start_time(watchdog)}
    try:
        driver.kill()
        driver.wait()
        assert _left(recorded) == {}
        assert "stopped 1 process(es) of its local Ray" in driver.stderr.read()
    finally:
        _kill(list(recorded))


def test_a_driver_that_stops_its_watchdog_leaves_its_children_alone(tmp_path):
    driver, (watchdog, child) = _start(STAND_IN, "exit")
    try:
        assert driver.wait(timeout=30) == 0
        assert start_time(watchdog) is None or _left({watchdog: start_time(watchdog)}) == {}
        assert start_time(child) is not None  # nothing was stopped on a normal exit
    finally:
        _kill([child])


def test_the_next_start_stops_what_a_run_killed_with_its_watchdog_left(tmp_path, caplog):
    driver, (watchdog, child) = _start(STAND_IN, "hang")
    recorded = {child: start_time(child)}
    try:
        _kill([watchdog, driver.pid])  # both at once: nobody was left to clean up
        driver.wait()
        assert _left(recorded, within_s=1.0) == recorded
        assert sweep_orphans() == {driver.pid: 1}
        assert _left(recorded) == {}
    finally:
        _kill([child])
    # Cluster start-up runs the sweep and says what it stopped.
    caplog.set_level(logging.WARNING, "m2flow.runtime.cluster")
    started = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(ray_watchdog, "sweep_orphans", lambda: {4242: 3})
    monkey.setattr(ray_watchdog, "start_watchdog", lambda marker: started.append(marker))
    monkey.setenv(ray_watchdog.ENV_VAR, "unset")
    try:
        cluster_mod._start_watched()
        assert os.environ[ray_watchdog.ENV_VAR] == started[0] and started[0].startswith(f"{os.getpid()}-")
    finally:
        monkey.undo()
    assert "stopped 3 process(es) left by the local Ray of an earlier run whose driver (pid 4242)" in caplog.text


RAY_DRIVER = textwrap.dedent("""
    import os, time
    from m2flow.runtime import Worker, WorkerGroup
    from m2flow.runtime.cluster import Cluster, ClusterConfig

    class Probe(Worker):
        def pid(self):
            return os.getpid()

    cluster = Cluster(ClusterConfig(num_cpus=1, cpu_devices_per_node=1))
    group = WorkerGroup(Probe, cluster, "probe", num_ranks=1)
    print(*group.pid().wait(timeout=120), flush=True)
    time.sleep(300)
""")


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_nothing_of_a_killed_driver_s_local_ray_outlives_it():
    driver, (worker,) = _start(RAY_DRIVER)
    try:
        # Ray's agents are started shortly after its head; wait for them to be below the driver.
        deadline = time.monotonic() + 60
        while True:
            session = descendants([driver.pid])
            titles = {_title(p) for p in session}
            if {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= titles or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= titles and worker in session, titles
        assert any("raylet" in t for t in titles) and any("gcs_server" in t for t in titles), titles
        time.sleep(2 * ray_watchdog.SCAN_S)  # the watchdog's record is up to date
        driver.kill()
        driver.wait()
        left = _left(session)
        assert left == {}, {p: _title(p) for p in left}
    finally:
        _kill([driver.pid, *session])


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
    except OSError:
        return ""
