"""``Channel``: the handle workers use to put into and get from a named channel.

A handle is small and picklable (name and host address), so it can be passed to workers as an
argument; each process opens one connection per channel on first use (``connection.py``) and
shares it between threads. Sync calls block; ``async_op=True`` returns a ``CommWork`` that can be
waited or awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from m2flow.runtime.channel.connection import (
    _CANCELLED,
    _CONNECTIONS,
    _CONNECTIONS_LOCK,
    ChannelAddress,
    ChannelClosed,
    _Connection,
    _connection,
    _unwrap_many,
)
from m2flow.runtime.channel.host import ChannelHost
from m2flow.runtime.channel.metrics import ChannelMetrics
from m2flow.runtime.comm.communicator import _node_id
from m2flow.runtime.comm.errors import CommTimeout
from m2flow.runtime.comm.rendezvous import Rendezvous, decode_record, default_rendezvous, encode_record
from m2flow.runtime.comm.work import CommWork, done_work

__all__ = ["Channel", "ChannelAddress", "ChannelClosed"]

_LOCAL_HOSTS: dict[str, ChannelHost] = {}


class _Mapped(CommWork):
    """A CommWork whose result is transformed, and that cancels its request on a timeout."""

    def __init__(self, fut: Future, fn: Any, conn: _Connection, req: int, what: str = "") -> None:
        super().__init__(fut, what=what)
        self._fut = fut
        self._fn = fn
        self._conn = conn
        self._req = req

    def wait(self, timeout: float | None = None) -> Any:
        """The result; on a timeout the request is withdrawn, so no item is taken and lost."""
        try:
            raw = super().wait(timeout)
        except CommTimeout:
            self._conn.cancel(self._req)  # the reply says whether an item was already on its way
            raw = super().wait(30.0)
            if raw is _CANCELLED:
                raise
        if raw is _CANCELLED:
            raise CommTimeout(f"{self._what} was withdrawn after a timeout")
        return self._fn(raw)

    def __await__(self):
        async def _wait() -> Any:
            return self._fn(await asyncio.wrap_future(self._fut))

        return _wait().__await__()


class _Fed(CommWork):
    """A plain get waiting for the host to push it an item; a timeout withdraws it."""

    def __init__(self, fut: Future, conn: _Connection, key: Hashable, what: str) -> None:
        super().__init__(fut, what=what)
        self._fut = fut
        self._conn = conn
        self._key = key

    def wait(self, timeout: float | None = None) -> Any:
        """The item; on a timeout the get is withdrawn, and an item already on its way stays queued here."""
        try:
            raw = super().wait(timeout)
        except CommTimeout:
            if self._conn.withdraw(self._key, self._fut):
                raise
            raw = self._fut.result()  # an item reached it as it timed out: not lost, returned
        return self._conn.decode(raw)

    def __await__(self):
        async def _wait() -> Any:
            return self._conn.decode(await asyncio.wrap_future(self._fut))

        return _wait().__await__()


class Channel:
    """A named FIFO queue shared by worker groups, with keyed sub-queues and optional capacity.

    ``maxsize`` bounds the number of items queued across all keys (0: unbounded); a put on a full
    channel blocks until a get frees a slot. ``close()`` ends the stream: consumers first receive
    every item put before it, then ``get`` raises ``ChannelClosed`` (iteration just stops).
    If the channel is empty and a producer died, a blocked get raises ``PeerDiedError`` naming it.

    A process that keeps calling ``get`` on a key is pushed items ahead of its gets, within a
    window that grows each time it runs dry (up to 32 items, and half of ``maxsize``), so a steady
    consumer never waits a round trip. Those items still count in the channel's size and capacity
    until a get returns them; if another process blocks on that key they are handed back to it,
    and they go back to the front of the queue when this process disconnects, exits or dies.
    ``prefetch`` (see ``with_options``) sets the smallest window.
    """

    def __init__(self, address: ChannelAddress, prefetch: int = 1) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.address = address
        self.prefetch = prefetch

    def with_options(self, prefetch: int) -> Channel:
        """The same channel, with gets that let the host push at least ``prefetch`` items ahead."""
        return Channel(self.address, prefetch)

    @property
    def name(self) -> str:
        return self.address.name

    @property
    def maxsize(self) -> int:
        return self.address.maxsize

    def __reduce__(self):
        return (Channel, (self.address, self.prefetch))

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize})"

    # -- creation ------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        *,
        local: bool = False,
        namespace: str | None = None,
        rendezvous: Rendezvous | None = None,
    ) -> Channel:
        """Start the channel's host: a Ray actor on this node when Ray is up, else (or with
        ``local``, or while this process hosts its workers, see ``runtime.inprocess``) threads in
        this process, which must then outlive the channel's users."""
        rdv = rendezvous or default_rendezvous(_namespace(namespace))
        address = _start_host(name, maxsize, local)
        rdv.publish(f"channel/{name}", encode_record(address))
        return cls(address)

    @classmethod
    def connect(cls, name: str, *, namespace: str | None = None, rendezvous: Rendezvous | None = None, timeout: float = 60.0) -> Channel:
        """A handle on a channel created elsewhere, looked up by name."""
        import time

        rdv = rendezvous or default_rendezvous(_namespace(namespace))
        deadline = time.monotonic() + timeout
        while True:
            raw = rdv.lookup(f"channel/{name}")
            if raw is not None:
                return cls(decode_record(ChannelAddress, raw))
            if time.monotonic() > deadline:
                raise CommTimeout(f"no channel named {name!r} was created within {timeout:.0f}s")
            time.sleep(0.02)

    @property
    def _conn(self) -> _Connection:
        return _connection(self.address)

    # -- queue operations ----------------------------------------------------------------------
    def put(self, item: Any, weight: float = 1, key: Hashable = None, async_op: bool = False, timeout: float | None = None) -> CommWork | None:
        """Append ``item`` to sub-queue ``key``; blocks while the channel is full."""
        fut = self._conn.put(item, weight, key)
        if fut is None:  # sent at once
            return done_work(None) if async_op else None
        work = CommWork(fut, what=f"put into channel {self.name!r}")
        return work if async_op else work.wait(timeout)

    def get(self, key: Hashable = None, async_op: bool = False, timeout: float | None = None) -> Any:
        """Take the oldest item of sub-queue ``key``; blocks while it is empty."""
        conn = self._conn
        item, fut = conn.take(key, self.prefetch)
        if fut is None:
            return done_work(item) if async_op else item
        work = _Fed(fut, conn, key, what=f"get from channel {self.name!r}")
        return work if async_op else work.wait(timeout)

    def get_batch(self, target_weight: float, key: Hashable = None, async_op: bool = False, timeout: float | None = None) -> Any:
        """Take items until their total weight reaches ``target_weight`` (never exceeding it, except
        that an item heavier than the target comes alone); blocks until then or until close."""
        if target_weight <= 0:
            raise ValueError(f"target_weight must be > 0, got {target_weight}")
        conn = self._conn
        conn.begin_batch(key)  # items pushed for plain gets come first, in order
        try:
            local, weight, complete = conn.take_batch(key, target_weight)
            if complete:
                conn.end_batch(key)
                return done_work(local) if async_op else local
            req, fut = conn.request(("get", key, float(target_weight), weight))
        except BaseException:
            conn.end_batch(key)
            raise
        fut.add_done_callback(lambda _: conn.end_batch(key))
        work = _Mapped(fut, lambda batch: local + _unwrap_many(batch), conn, req, what=f"get_batch from channel {self.name!r}")
        return work if async_op else work.wait(timeout)

    def _stat(self, what: str, key: Hashable = None) -> Any:
        conn = self._conn
        conn.report_all()  # this process's own gets show in the answer
        return conn.request(("stat", what, key))[1].result(timeout=60)

    def qsize(self, key: Hashable = None) -> int:
        """Items queued under ``key``."""
        return self._stat("qsize", key)

    def total_size(self) -> int:
        """Items queued under all keys."""
        return self._stat("total")

    def empty(self, key: Hashable = None) -> bool:
        return self.qsize(key) == 0

    def full(self) -> bool:
        """True when a bounded channel holds ``maxsize`` items."""
        return self._stat("full")

    def keys(self) -> list[Hashable]:
        """Keys whose sub-queue holds items."""
        return self._stat("keys")

    def metrics(self) -> ChannelMetrics:
        """Depth over time and put/get wait times, as recorded by the host."""
        return self._stat("metrics")

    def close(self, sync: bool = True, timeout: float = 60.0) -> None:
        """End the stream for everyone: pending and future gets finish with ``ChannelClosed``.

        ``sync``: first wait until every connected process has confirmed that the puts it sent before
        are queued, so none is lost to the close. A process that cannot answer (frozen, or stuck in a
        long call) holds such a close back until it dies: a teardown, after which nothing takes the
        items anyway, closes with ``sync=False`` at once. ``timeout``: seconds to wait for the host's
        answer (``CommTimeout`` past it)."""
        fut = self._conn.request(("close", sync))[1]
        try:
            fut.result(timeout=timeout)
        except FutureTimeout:
            raise CommTimeout(f"channel {self.name!r}: no answer to close within {timeout:g}s") from None

    @property
    def closed(self) -> bool:
        return self._stat("closed")

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                yield self.get()
            except ChannelClosed:
                return

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        while True:
            try:
                yield await self.get(async_op=True)
            except ChannelClosed:
                return

    def disconnect(self) -> None:
        """Close this process's connection (prefetched items go back); the channel lives on."""
        key = (self.address.name, self.address.unix_address, self.address.tcp_address)
        with _CONNECTIONS_LOCK:
            conn = _CONNECTIONS.pop(key, None)
        if conn is not None:
            conn.close()

    def destroy(self) -> None:
        """Stop the host; queued items are dropped."""
        destroy_host(self.address)


def _namespace(namespace: str | None) -> str:
    if namespace is not None:
        return namespace
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().namespace
    except Exception:
        pass
    return "default"


def _start_host(name: str, maxsize: int, local: bool) -> ChannelAddress:
    import ray

    from m2flow.runtime import inprocess

    if not local and not inprocess.hosting() and ray.is_initialized():
        from m2flow.runtime.channel.actor import start_host_actor

        return start_host_actor(name, maxsize)
    host = ChannelHost(name, maxsize)
    _LOCAL_HOSTS[name] = host
    return ChannelAddress(name, _node_id(), host.unix_address, host.tcp_address, maxsize)


def destroy_host(address: ChannelAddress) -> None:
    if address.actor_name is not None:
        from m2flow.runtime.channel.actor import stop_host_actor

        stop_host_actor(address.actor_name, address.host_key)
        return
    host = _LOCAL_HOSTS.pop(address.name, None)
    if host is not None:
        host.shutdown()
