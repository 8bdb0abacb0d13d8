"""Rank processes kept for reuse, and the directory that finds a group's processes by the group's name.

Starting a rank's process costs seconds of CPU: a Python that imports Ray, torch and transformers. A run that
restarts after a fault, a plan search that probes several plans, or a test suite that runs many small runs in
one Ray session starts the same kinds of processes again and again. So a group that shuts down cleanly hands
its processes back here (``release_later``): each host takes its worker apart and reports whether it is clean
(``RankHost.release``); clean ones wait, per node, for a later group (``take``), the rest are killed. The
hand-back runs in a thread of this process, so a shutdown returns at once, as a kill would.

A reused process keeps what its imports built and nothing of the run it served: its worker, environment
variables, affinity, logging, tracing, torch's generator seed and compiled graphs are put back as a new
process has them, and a process that cannot show that (a call still running, threads or child processes
left) is not reused. Detached groups never use the pool (they outlive this driver).

A reused process keeps the Ray name it was created with, so a group's processes are found by the group's
name through this module's directory (Ray's key-value store, in the cluster's namespace) rather than by
Ray actor names.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 10.0
"""How long a host may take to release its worker before it is killed instead."""

_DIRECTORY_PREFIX = "m2flow-group:"

_lock = threading.Lock()
_idle: dict[tuple[str, str, int], list[tuple[Any, str]]] = {}
"""(node id, namespace, max_concurrency) -> released hosts (handle, Ray name), oldest first."""
_pending: dict[int, tuple[Any, str]] = {}
"""Hosts asked to release and not yet settled, by ``id``."""
_epoch = 0
"""Bumped by ``clear``: a hand-back begun before it kills its hosts instead of pooling them."""
_settling: set[threading.Thread] = set()
"""Hand-back threads still waiting on their hosts' answers."""
counts = {"reused": 0, "pooled": 0, "killed": 0}
"""Since this process started: hosts taken from the pool, handed back clean, killed at a shutdown."""


# -- the pool --------------------------------------------------------------------------------------
def take(node_id: str, namespace: str, max_concurrency: int) -> tuple[Any, str] | None:
    """A released host on ``node_id`` for a group of this shape, with its Ray name, or None."""
    with _lock:
        hosts = _idle.get((node_id, namespace, max_concurrency))
        if not hosts:
            return None
        counts["reused"] += 1
        return hosts.pop()


def idle_count() -> int:
    """Hosts waiting in the pool now."""
    with _lock:
        return sum(len(h) for h in _idle.values())


def clear() -> None:
    """Kill every pooled host and every host still handing itself back (Ray is about to shut down): a run's
    end leaves no rank process to Ray's own teardown, as when each group killed its processes itself.

    Returns once every hand-back thread has left Ray (its hosts are dead, so their answers come at once; at
    most ``RELEASE_TIMEOUT_S``): a thread still inside ``ray.wait`` while Ray shuts down can crash the
    process at exit."""
    global _epoch
    with _lock:
        _epoch += 1
        hosts = [h for pooled in _idle.values() for h, _ in pooled] + [h for h, _ in _pending.values()]
        _idle.clear()
        _pending.clear()
        threads = list(_settling)
    _kill_all(hosts)
    for t in threads:
        t.join(RELEASE_TIMEOUT_S)


def release_later(hosts: Sequence[tuple[Any, str]], keys: Sequence[tuple[str, str, int]], keep: int) -> None:
    """Ask each of ``hosts`` (handle, Ray name) to release its worker, in a thread of this process; pool the
    clean ones (up to ``keep`` per key, one key per host) and kill the rest."""
    if not hosts:
        return
    if keep <= 0:
        _kill_all([h for h, _ in hosts])
        return
    with _lock:
        epoch = _epoch
        _pending.update((id(h), h) for h in hosts)
    refs = []
    for h, _ in hosts:
        try:
            refs.append(h.release.remote())
        except Exception:  # noqa: BLE001 - the host is gone (or Ray is); nothing to release
            refs.append(None)
    thread = threading.Thread(target=_settle_then_leave, args=(list(hosts), list(keys), refs, keep, epoch),
                              daemon=True, name="m2flow-host-release")
    with _lock:
        _settling.add(thread)
    thread.start()


def _settle_then_leave(*args: Any) -> None:
    try:
        _settle(*args)
    finally:
        with _lock:
            _settling.discard(threading.current_thread())


def _settle(hosts: list[tuple[Any, str]], keys: list[tuple[str, str, int]], refs: list[Any], keep: int,
            epoch: int) -> None:
    import ray

    live = [r for r in refs if r is not None]
    try:
        ready, _ = ray.wait(live, num_returns=len(live), timeout=RELEASE_TIMEOUT_S) if live else ([], [])
    except Exception:  # noqa: BLE001 - Ray went away: the hosts went with it
        return
    done = set(ready)
    for host, key, ref in zip(hosts, keys, refs):
        why = "it did not answer" if ref is None or ref not in done else _answer(ref)
        with _lock:
            if _pending.pop(id(host), None) is None or epoch != _epoch:
                continue  # ``clear`` killed it already
        if not why:
            with _lock:
                pooled = _idle.setdefault(key, [])
                if len(pooled) < keep:
                    pooled.append(host)
                    counts["pooled"] += 1
                    continue
            why = "the pool is full"
        log.debug("not reusing rank process %s: %s", host[1], why)
        _kill_all([host[0]])


def _answer(ref: Any) -> str:
    import ray

    try:
        return ray.get(ref, timeout=0)
    except Exception as e:  # noqa: BLE001 - died during the release
        return f"its release failed: {type(e).__name__}"


def _kill_all(hosts: Sequence[Any]) -> None:
    import ray

    with _lock:
        counts["killed"] += len(hosts)
    for h in hosts:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


# -- the directory ---------------------------------------------------------------------------------
def register(namespace: str, group: str, actor_names: Sequence[str]) -> None:
    """Record the Ray names of ``group``'s rank processes, rank by rank."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_DIRECTORY_PREFIX + group, json.dumps(list(actor_names)), overwrite=True,
                                 namespace=namespace)


def unregister(namespace: str, group: str) -> None:
    from ray.experimental import internal_kv

    try:
        internal_kv._internal_kv_del(_DIRECTORY_PREFIX + group, namespace=namespace)
    except Exception:  # noqa: BLE001 - Ray is gone, and the directory with it
        pass


def lookup(namespace: str, group: str) -> list[str] | None:
    """The Ray names of ``group``'s rank processes, or None when no such group runs."""
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(_DIRECTORY_PREFIX + group, namespace=namespace)
    return None if value is None else json.loads(value)


def groups(namespace: str) -> list[str]:
    """The names of the groups running in ``namespace``."""
    from ray.experimental import internal_kv

    keys = internal_kv._internal_kv_list(_DIRECTORY_PREFIX, namespace=namespace)
    return sorted(k.decode()[len(_DIRECTORY_PREFIX):] if isinstance(k, bytes) else k[len(_DIRECTORY_PREFIX):]
                  for k in keys)
