"""The channel host as a Ray actor, placed on the node of whoever creates the channel."""

from __future__ import annotations

import uuid

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from m2flow.runtime.channel.host import ChannelHost

_ACTORS: dict[str, object] = {}


class _HostActor:
    def __init__(self, name: str, maxsize: int, host_ip: str) -> None:
        self.host = ChannelHost(name, maxsize, host_ip)

    def addresses(self) -> tuple[str, tuple, tuple]:
        return ray.get_runtime_context().get_node_id(), self.host.unix_address, self.host.tcp_address


def start_host_actor(name: str, maxsize: int):
    """Launch the host actor (no CPU reserved: it mostly sleeps in socket reads)."""
    from m2flow.runtime.channel.client import ChannelAddress

    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    ip = ray.util.get_node_ip_address()
    actor_name = f"m2flow-channel:{name}:{uuid.uuid4().hex[:8]}"
    actor = (
        ray.remote(_HostActor)
        .options(
            name=actor_name,
            num_cpus=0,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True),
        )
        .remote(name, maxsize, ip)
    )
    _ACTORS[actor_name] = actor  # the handle keeps the host alive as long as this process
    node, unix, tcp = ray.get(actor.addresses.remote())
    return ChannelAddress(name, node, unix, tcp, maxsize, actor_name=actor_name)
