"""Channel hosts in a Ray actor, placed on the node of whoever creates the channels.

The channels one process creates on its node share one host actor process: a flow's three or four
data edges cost one process start, not one each. Each channel keeps a ``ChannelHost`` of its own
in it (own sockets, serving threads and depth track); the actor ends with the last channel its
creator releases, so a process that runs many flows keeps no host process of finished ones.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from m2flow.runtime.channel.connection import ChannelAddress
from m2flow.runtime.channel.host import ChannelHost
from m2flow.runtime.auth import adopt, secret_hex
from m2flow.runtime.trace import ProcessInfo, Tracer, get_tracer

# A host actor may be killed without running exit handlers: it writes its depth tracks this often.
TRACE_FLUSH_S = 1.0
# Seconds a creator waits for its host actor to open or close one channel.
CALL_TIMEOUT_S = 60.0


class _HostActor:
    """The channels of one creating process on one node, each served by its own ``ChannelHost``."""

    def __init__(self, host_ip: str, secret: str | None = None) -> None:
        adopt(secret)  # the hosts admit only processes that hold the run's secret
        self.host_ip = host_ip
        self._lock = threading.Lock()
        self._hosts: dict[str, ChannelHost] = {}
        self._tracers: dict[str, Tracer] = {}
        self._flusher: threading.Thread | None = None

    def open(self, key: str, name: str, maxsize: int, trace_dir: str | None = None,
             node_rank: int = 0) -> tuple[str, tuple, tuple]:
        """Start the host of channel ``name`` under ``key``; returns its node and addresses.

        With ``trace_dir``, its depth becomes the ``channel/<name>`` counter track of the run's
        merged trace, from a shard of its own, as a host process of its own would write.
        """
        tracer = None
        if trace_dir is not None:
            tracer = Tracer(trace_dir, ProcessInfo(f"channel:{name}", 0, node_rank))
        host = ChannelHost(name, maxsize, self.host_ip, tracer=tracer)
        with self._lock:
            self._hosts[key] = host
            if tracer is not None:
                self._tracers[key] = tracer
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_every, args=(TRACE_FLUSH_S,),
                                                     daemon=True, name="m2flow-trace-channels")
                    self._flusher.start()
        return ray.get_runtime_context().get_node_id(), host.unix_address, host.tcp_address

    def close(self, key: str) -> int:
        """Stop the host under ``key`` (queued items are dropped); returns how many hosts remain."""
        with self._lock:
            host = self._hosts.pop(key, None)
            tracer = self._tracers.pop(key, None)
        if host is not None:
            host.shutdown()
        if tracer is not None:
            tracer.flush()
        with self._lock:
            return len(self._hosts)

    def pid(self) -> int:
        """This host process's id (which process hosts which channels)."""
        return os.getpid()

    def flush_trace(self) -> int:
        """Write every host's buffered depth samples to its trace shard; returns how many."""
        with self._lock:
            tracers = list(self._tracers.values())
        return sum(t.flush() for t in tracers)

    def _flush_every(self, period_s: float) -> None:
        while True:
            time.sleep(period_s)
            self.flush_trace()


@dataclass
class _Shared:
    """This process's host actor on its node, and the keys of the channels it still hosts."""

    name: str
    actor: object
    keys: set[str] = field(default_factory=set)


_SHARED: dict[tuple[str, str], _Shared] = {}  # (node id, secret) -> the actor this process created
_SHARED_LOCK = threading.Lock()


def start_host_actor(name: str, maxsize: int) -> ChannelAddress:
    """Host channel ``name`` in this process's host actor on its node (started on first use; no CPU
    reserved: it mostly sleeps in socket reads).

    The actor is keyed by the run's secret too, so it admits exactly the processes the channel
    should. When this process traces to a directory, the host traces there: its depth becomes the
    ``channel/<name>`` counter track of the run's merged trace.
    """
    node_id = ray.get_runtime_context().get_node_id()
    secret = secret_hex()
    tracer = get_tracer()
    trace_dir = str(tracer.trace_dir) if tracer.enabled and tracer.trace_dir is not None else None
    key = f"{name}:{uuid.uuid4().hex[:8]}"
    with _SHARED_LOCK:  # one actor per node and secret, even when threads create channels at once
        for stale in [k for k in _SHARED if k[0] != node_id]:  # handles of a Ray session that ended
            del _SHARED[stale]
        for attempt in range(2):
            shared = _SHARED.get((node_id, secret))
            if shared is None:
                shared = _SHARED[(node_id, secret)] = _launch(node_id, secret)
            try:
                node, unix, tcp = ray.get(
                    shared.actor.open.remote(key, name, maxsize, trace_dir, tracer.info.node_rank),
                    timeout=CALL_TIMEOUT_S,
                )
                break
            except ray.exceptions.RayActorError:
                del _SHARED[(node_id, secret)]  # killed from outside: start a fresh one once
                if attempt:
                    raise
        shared.keys.add(key)
    return ChannelAddress(name, node, unix, tcp, maxsize, actor_name=shared.name, host_key=key)


def _launch(node_id: str, secret: str) -> _Shared:
    name = f"m2flow-channels:{uuid.uuid4().hex[:8]}"
    actor = (
        ray.remote(_HostActor)
        .options(
            name=name,
            num_cpus=0,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True),
        )
        .remote(ray.util.get_node_ip_address(), secret)
    )
    return _Shared(name, actor)  # the handle keeps the actor alive as long as this process


def stop_host_actor(actor_name: str, key: str | None) -> None:
    """Stop one channel's host started by ``start_host_actor`` (from anywhere in the cluster); queued
    items are dropped. The creator's last channel takes the actor with it; a channel released by
    another process only stops its host, and the actor ends with its creator."""
    with _SHARED_LOCK:
        shared = next((s for s in _SHARED.values() if s.name == actor_name), None)
        last = False
        if shared is not None:
            shared.keys.discard(key)
            last = not shared.keys
            if last:
                del _SHARED[next(k for k, s in _SHARED.items() if s is shared)]
    if last:
        ray.kill(shared.actor)  # its last channel: the process ends with it
        return
    try:
        actor = shared.actor if shared is not None else ray.get_actor(actor_name)
        ray.get(actor.close.remote(key), timeout=CALL_TIMEOUT_S)
    except ValueError:  # already gone
        pass
    except ray.exceptions.RayActorError:  # died meanwhile: its hosts went with it
        pass
