"""Nothing of a locally started Ray outlives its driver, even one killed with SIGKILL.

Ray ties its head processes (GCS, raylet, log monitor) to the driver with ``PR_SET_PDEATHSIG``, and
its workers exit with the raylet; but the raylet's own children, ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent`` (an HTTP server on the node's address, which Ray starts whatever the
dashboard setting), notice the raylet's death and then block for a minute or more trying to report
it to the GCS that died with it. So, for a local Ray:

- **a watchdog** (this file, run as a script by ``start_watchdog``: standard library only, in a
  session of its own so a signal to the driver's process group does not reach it) polls its parent,
  the driver, and every ``SCAN_S`` records the driver's descendants (pid and start time, in a state
  file too). When the driver is gone it sends SIGTERM, then SIGKILL, to those still running (the
  same pid and start time) and to any process whose environment carries the run's marker
  ``M2FLOW_RAY_SESSION`` (one started since the last scan), and says so on stderr. A driver that
  shuts Ray down itself stops the watchdog first (SIGTERM), so a normal exit kills nothing;
- **the next start** (``sweep_orphans``) reads the state files of runs whose driver and watchdog
  are both gone (killed together) and stops what they recorded, saying so.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

ENV_VAR = "M2FLOW_RAY_SESSION"
POLL_S = 0.2
"""How often the watchdog checks that the driver still runs."""
SCAN_S = 1.0
"""How often it records the driver's descendants."""
GRACE_S = 2.0
"""How long processes get to exit after SIGTERM before SIGKILL."""
STATE_DIR = Path(tempfile.gettempdir()) / "m2flow-ray"
"""One ``<marker>.json`` per watched Ray: driver pid, watchdog pid, {pid: start time} of its processes."""


def new_marker() -> str:
    """A marker for a Ray started by this process: ``<pid>-<random hex>``."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), [] when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, it names one process; None when it
    no longer runs (a zombie, dead but not reaped, does not count)."""
    fields = _stat(pid)
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[19])


def _alive(pid: int) -> bool:
    return start_time(pid) is not None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def descendants(roots: list[int]) -> dict[int, int]:
    """{pid: start time} of every running descendant of ``roots`` (not the roots, not this process)."""
    found: dict[int, int] = {}
    todo = list(roots)
    while todo:
        for child in _children(todo.pop()):
            t = start_time(child)
            if child != os.getpid() and t is not None and child not in found:
                found[child] = t
                todo.append(child)
    return found


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:  # gone, or another user's process
        return b""


def marked(marker: str) -> dict[int, int]:
    """{pid: start time} of the processes whose environment still shows ``marker`` (a process that
    rewrites its title, as Ray's workers and agents do, may have overwritten it)."""
    needle = f"{ENV_VAR}={marker}".encode() + b"\0"
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and needle in _environ(int(entry)):
            t = start_time(int(entry))
            if t is not None:
                out[int(entry)] = t
    return out


def stop(processes: dict[int, int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM to each process {pid: start time} still running, SIGKILL to those left after ``grace_s``;
    returns the pids signalled. A pid whose start time differs is another process now: left alone."""
    sent = []
    for pid, t in processes.items():
        if start_time(pid) == t:
            try:
                os.kill(pid, signal.SIGTERM)
                sent.append(pid)
            except OSError:
                pass
    deadline = time.monotonic() + grace_s
    while any(start_time(p) == processes[p] for p in sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in sent:
        if start_time(pid) == processes[pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return sent


def _state_file(marker: str) -> Path:
    return STATE_DIR / f"{marker}.json"


def _save(marker: str, driver: int, processes: dict[int, int]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path = _state_file(marker)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"driver": driver, "watchdog": os.getpid(),
                               "processes": {str(p): t for p, t in processes.items()}}))
    os.replace(tmp, path)


def sweep_orphans() -> dict[int, int]:
    """Stop what the watched Rays of earlier runs left when their driver and watchdog were both killed;
    returns {driver pid: processes stopped}."""
    out: dict[int, int] = {}
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            state = json.loads(path.read_text())
            driver, watchdog = int(state["driver"]), int(state["watchdog"])
            processes = {int(p): int(t) for p, t in state["processes"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(driver) or _alive(watchdog):
            continue  # a run still going, or its watchdog at work
        stopped = stop(processes)
        if stopped:
            out[driver] = len(stopped)
        path.unlink(missing_ok=True)
    return out


def start_watchdog(marker: str) -> subprocess.Popen:
    """Start the watchdog of this process (the driver) for the Ray it is about to start under ``marker``."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}  # it must not find itself
    return subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), marker],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                            start_new_session=True, close_fds=True)


def stop_watchdog(watchdog: subprocess.Popen | None) -> None:
    """Stop the watchdog without it touching anything (the driver is shutting Ray down itself)."""
    if watchdog is None or watchdog.poll() is not None:
        return
    watchdog.terminate()
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watchdog.kill()


def _watch(driver: int, marker: str) -> None:
    """Record ``driver``'s descendants until it goes (this process's parent changes), then stop them."""
    def leave(*_: object) -> None:
        _state_file(marker).unlink(missing_ok=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tracked: dict[int, int] = {}
    last_scan = 0.0
    while os.getppid() == driver:
        if time.monotonic() - last_scan >= SCAN_S:
            # Kept while they run, even once no longer below the driver (a parent that died first).
            now = {p: t for p, t in {**tracked, **descendants([driver])}.items() if start_time(p) == t}
            if now.keys() != tracked.keys():
                _save(marker, driver, now)
            tracked, last_scan = now, time.monotonic()
        time.sleep(POLL_S)
    targets = {**tracked, **marked(marker)}
    targets.update(descendants(list(targets)))  # what they started since the last scan
    stopped = stop(targets)
    _state_file(marker).unlink(missing_ok=True)
    if stopped:
        log.warning("m2flow: the driver (pid %d) is gone; stopped %d process(es) of its local Ray that were "
                    "still running", driver, len(stopped))


if __name__ == "__main__":
    # A process of its own (its stderr is the driver's): one plain line per message.
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    _watch(int(sys.argv[1]), sys.argv[2])
