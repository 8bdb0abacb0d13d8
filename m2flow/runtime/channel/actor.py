"""The channel host as a Ray actor, placed on the node of whoever creates the channel."""

from __future__ import annotations

import threading
import time
import uuid

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from m2flow.runtime.channel.connection import ChannelAddress
from m2flow.runtime.channel.host import ChannelHost
from m2flow.runtime.auth import adopt, secret_hex
from m2flow.runtime.trace import ProcessInfo, Tracer, configure_tracer, get_tracer

_ACTORS: dict[str, object] = {}
# A host actor may be killed without running exit handlers: it writes its depth track this often.
TRACE_FLUSH_S = 1.0


class _HostActor:
    def __init__(self, name: str, maxsize: int, host_ip: str, trace_dir: str | None = None,
                 node_rank: int = 0, secret: str | None = None) -> None:
        adopt(secret)  # the host admits only processes that hold the run's secret
        if trace_dir is not None:
            tracer = configure_tracer(trace_dir, ProcessInfo(f"channel:{name}", 0, node_rank))
            threading.Thread(target=_flush_every, args=(tracer, TRACE_FLUSH_S), daemon=True,
                             name=f"m2flow-trace-{name}").start()
        self.host = ChannelHost(name, maxsize, host_ip)

    def addresses(self) -> tuple[str, tuple, tuple]:
        return ray.get_runtime_context().get_node_id(), self.host.unix_address, self.host.tcp_address

    def flush_trace(self) -> int:
        """Write the buffered depth samples to this host's trace shard; returns how many."""
        return get_tracer().flush()


def _flush_every(tracer: Tracer, period_s: float) -> None:
    while True:
        time.sleep(period_s)
        tracer.flush()


def start_host_actor(name: str, maxsize: int):
    """Launch the host actor (no CPU reserved: it mostly sleeps in socket reads).

    When this process traces to a directory, the host traces there too: its depth becomes the
    ``channel/<name>`` counter track of the run's merged trace.
    """
    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    ip = ray.util.get_node_ip_address()
    tracer = get_tracer()
    trace_dir = str(tracer.trace_dir) if tracer.enabled and tracer.trace_dir is not None else None
    actor_name = f"m2flow-channel:{name}:{uuid.uuid4().hex[:8]}"
    actor = (
        ray.remote(_HostActor)
        .options(
            name=actor_name,
            num_cpus=0,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True),
        )
        .remote(name, maxsize, ip, trace_dir, tracer.info.node_rank, secret_hex())
    )
    _ACTORS[actor_name] = actor  # the handle keeps the host alive as long as this process
    node, unix, tcp = ray.get(actor.addresses.remote())
    return ChannelAddress(name, node, unix, tcp, maxsize, actor_name=actor_name)


def stop_host_actor(actor_name: str) -> None:
    """Kill a host actor started by ``start_host_actor`` (anywhere in the cluster); queued items are dropped."""
    _ACTORS.pop(actor_name, None)
    try:
        ray.kill(ray.get_actor(actor_name))
    except ValueError:  # already gone
        pass
