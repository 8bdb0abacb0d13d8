"""Context switching: a per-device lock that collocated workers take in turn, and the offload/onload protocol.

The lock is an advisory ``flock`` on one file per (cluster, node, device) in ``/dev/shm`` (or the temp
dir). ``flock`` was chosen over a lock actor because it needs no round trip through Ray, is held per open
file so two workers in one process still exclude each other, and is released by the kernel when the
holding process dies, so a crashed worker can never leave its devices locked.

The lock files of a cluster live in ``m2flow-locks-<uid>/<cluster id>/`` (directories 0700, files
0600: only the run's user can take or block its devices); ``remove_lock_dir`` deletes a cluster's
directory when its run ends (``Cluster.shutdown`` and at the driver's exit).
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from m2flow.runtime.trace import get_tracer

log = logging.getLogger(__name__)


@runtime_checkable
class Offloadable(Protocol):
    """State holders that can leave the device while another component has its turn."""

    def offload(self) -> None:
        """Move device state (weights, grads, optimizer state, caches) to host memory."""

    def onload(self) -> None:
        """Bring the state back onto the device."""


@dataclass(frozen=True)
class LockSpan:
    """One holding of a device lock, in ``time.time()`` seconds."""

    owner: str
    devices: tuple[int, ...]
    acquired: float
    released: float
    waited: float


def _lock_root() -> Path:
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    # Per user: a shared root created 0700 by one user would lock every other user out.
    return base / f"m2flow-locks-{os.getuid()}"


def lock_dir(cluster_id: str) -> Path:
    """The directory holding ``cluster_id``'s lock files on this node."""
    return _lock_root() / cluster_id


def remove_lock_dir(cluster_id: str) -> bool:
    """Delete ``cluster_id``'s lock directory unless a lock in it is held; True when it is gone.

    A held lock means a worker of the cluster still runs here: its files must stay, or a newcomer
    would lock a fresh file and no longer exclude it.
    """
    directory = lock_dir(cluster_id)
    if not directory.is_dir():
        return True
    fds: list[int] = []
    try:
        for path in directory.glob("device*.lock"):
            fd = os.open(path, os.O_RDWR)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.debug("%s is still held; its lock directory stays", path)
                return False
        for path in directory.iterdir():
            path.unlink(missing_ok=True)
        directory.rmdir()
        return True
    except OSError as exc:
        log.debug("could not remove the lock directory %s: %s", directory, exc)
        return False
    finally:
        for fd in fds:
            os.close(fd)


class DeviceLock:
    """Exclusive use of a set of devices on one node, shared by all processes of one cluster."""

    def __init__(self, cluster_id: str, devices: Sequence[int], owner: str = "") -> None:
        if not devices:
            raise ValueError("a device lock needs at least one device")
        self.devices = tuple(sorted(set(devices)))  # sorted: a fixed order rules out deadlock
        self.owner = owner or f"pid{os.getpid()}"
        self._dir = lock_dir(cluster_id)
        self._dir.parent.mkdir(mode=0o700, exist_ok=True)
        self._dir.mkdir(mode=0o700, exist_ok=True)
        self._fds: list[int] = []
        self._guard = threading.Lock()
        self._t_acquired = 0.0
        self._waited = 0.0
        self.history: list[LockSpan] = []

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def acquire(self, timeout: float | None = None) -> None:
        """Block until every device of the set is ours; ``TimeoutError`` after ``timeout`` seconds."""
        t0 = time.perf_counter_ns()
        self._guard.acquire()
        start = time.time()
        try:
            for d in self.devices:
                fd = os.open(self._dir / f"device{d}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    self._flock(fd, start, timeout)
                except BaseException:
                    os.close(fd)
                    raise
                self._fds.append(fd)
        except BaseException:
            self._unlock_all()
            self._guard.release()
            raise
        self._t_acquired = time.time()
        self._waited = self._t_acquired - start
        tracer = get_tracer()
        if tracer.enabled:
            tracer.complete("wait_lock", t0, time.perf_counter_ns() - t0, cat="wait_lock",
                            devices=list(self.devices))
            for d in self.devices:  # ownership track per device: this owner's series is 1 while held
                tracer.counter(f"device_lock/{d}", 1, series=self.owner)

    def _flock(self, fd: int, start: float, timeout: float | None) -> None:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.time() - start >= timeout:
                    raise TimeoutError(
                        f"{self.owner}: devices {list(self.devices)} still held by another worker "
                        f"after {timeout:.1f}s"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.01)

    def _unlock_all(self) -> None:
        for fd in reversed(self._fds):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._fds.clear()

    def release(self) -> None:
        """Give the devices back; records the span in ``history``."""
        if not self._fds:
            raise RuntimeError(f"{self.owner}: release of a device lock that is not held")
        released = time.time()
        self._unlock_all()
        tracer = get_tracer()
        if tracer.enabled:
            for d in self.devices:
                tracer.counter(f"device_lock/{d}", 0, series=self.owner)
        self.history.append(
            LockSpan(self.owner, self.devices, self._t_acquired, released, self._waited)
        )
        self._guard.release()

    def __enter__(self) -> DeviceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def device_turn(
    lock: DeviceLock, state: Offloadable | None = None, offload_after: bool = False,
    timeout: float | None = None,
) -> Iterator[None]:
    """Take the devices, bring ``state`` on, run the block, and offload again when asked.

    ``state.onload()`` runs after the lock is held and ``state.offload()`` before it is released, so a
    component's memory is on the device only during its own turn.
    """
    tracer = get_tracer()
    lock.acquire(timeout)
    try:
        if state is not None:
            with tracer.span("onload", cat="onload"):
                state.onload()
        yield
    finally:
        try:
            if state is not None and offload_after:
                with tracer.span("offload", cat="offload"):
                    state.offload()
        finally:
            lock.release()
