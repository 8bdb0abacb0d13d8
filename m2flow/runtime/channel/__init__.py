"""Channels: named, distributed FIFO queues between worker groups (see ``client.Channel``)."""

from m2flow.runtime.channel.client import Channel, ChannelAddress, ChannelClosed
from m2flow.runtime.channel.host import ChannelHost
from m2flow.runtime.channel.metrics import ChannelMetrics, WaitStats

__all__ = ["Channel", "ChannelAddress", "ChannelClosed", "ChannelHost", "ChannelMetrics", "WaitStats"]
