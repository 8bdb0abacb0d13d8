"""This process's connection to one channel host: requests, replies, credits and prefetched items.

One connection per (process, channel) is shared by every handle and thread; a reader thread
resolves each request's future from the host's replies.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from m2flow.runtime.comm.communicator import PROCESS_UID, _node_id
from m2flow.runtime.comm.errors import CommError, PeerDiedError
from m2flow.runtime.comm.payload import Desc, pack, unpack
from m2flow.runtime.comm.rendezvous import HOSTNAME
from m2flow.runtime.comm.serialization import encode
from m2flow.runtime.comm.shm import SegmentCache, SegmentPool
from m2flow.runtime.comm.wire import BufferPool, Connection, ConnectionLost, connect

log = logging.getLogger(__name__)

_CREDIT_BATCH = 64  # slots a producer asks for at once on a bounded channel


class ChannelClosed(Exception):
    """The channel was closed and (for a get) everything put before the close has been taken."""


@dataclass(frozen=True)
class ChannelAddress:
    """Where a channel's host listens, and its capacity."""

    name: str
    node_id: str
    unix_address: tuple
    tcp_address: tuple
    maxsize: int
    actor_name: str | None = None


def _identity() -> str:
    name = None
    try:
        import ray

        if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            name = ray.get_runtime_context().get_actor_name()
    except Exception:
        pass
    where = f"pid {os.getpid()} on {HOSTNAME}"
    return f"{name} ({where})" if name else where


class _Connection:
    """This process's connection to one channel host: requests, replies, credits."""

    def __init__(self, address: ChannelAddress) -> None:
        self.address = address
        self.same_node = address.node_id == _node_id()
        try:
            where = address.unix_address if self.same_node else address.tcp_address
            self.conn: Connection = connect(where, pool=None if self.same_node else BufferPool())
            self.conn.send(("hello", _identity()))
        except (OSError, ConnectionLost) as exc:
            raise PeerDiedError(f"cannot reach the host of channel {address.name!r}: {exc}") from exc
        self.pool = SegmentPool(f"{PROCESS_UID}:channel:{address.name}") if self.same_node else None
        self.cache = SegmentCache()
        self.closed = False  # the channel, as last heard from the host
        self.lost: str | None = None
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._futures: dict[int, Future] = {}
        self._batches: dict[int, list[Any]] = {}
        self._credits = 0
        self._credit_req: int | None = None
        self._pending_puts: list[tuple[tuple, list, list[int], Future]] = []
        self._local: dict[Hashable, deque[tuple[float, Any]]] = {}  # prefetched, not yet taken
        threading.Thread(target=self._read, daemon=True, name=f"m2flow-chc-{address.name}").start()

    # -- requests ------------------------------------------------------------------------------
    def request(self, control: tuple) -> tuple[int, Future]:
        req = next(self._ids)
        fut: Future = Future()
        with self._lock:
            self._check()
            self._futures[req] = fut
        self._send((control[0], req, *control[1:]))
        return req, fut

    def _send(self, control: tuple, inline: list | None = None, fds: list[int] | None = None) -> None:
        try:
            self.conn.send(control, inline or (), fds or ())
        except ConnectionLost as exc:
            raise self._lost_error(str(exc)) from exc

    def _check(self) -> None:
        if self.lost is not None:
            raise self._lost_error(self.lost)

    def _lost_error(self, why: str) -> PeerDiedError:
        return PeerDiedError(f"the host of channel {self.address.name!r} is gone: {why}")

    def cancel(self, req: int) -> None:
        self._send(("cancel", req))

    def put(self, item: Any, weight: float, key: Hashable) -> Future:
        packed = pack(encode(item), self.pool)
        control = ("put", key, weight, packed.desc.to_wire())
        fut: Future = Future()
        with self._lock:
            self._check()
            if self.closed:
                raise ChannelClosed(f"channel {self.address.name!r} is closed")
            if not self.address.maxsize or (self._credits > 0 and not self._pending_puts):
                self._credits -= 1
                self._send(control, packed.inline, packed.fds)  # under the lock: puts stay in order
                fut.set_result(None)
                return fut
            self._pending_puts.append((control, packed.inline, packed.fds, fut))
            if self._credit_req is None:
                self._credit_req = req = next(self._ids)
                self._send(("credit", req, min(_CREDIT_BATCH, self.address.maxsize)))
        return fut

    # -- replies -------------------------------------------------------------------------------
    def _read(self) -> None:
        why = "connection closed"
        try:
            while True:
                control, inline, fds = self.conn.recv()
                self._on_reply(control, inline, fds)
        except ConnectionLost as exc:
            why = str(exc) or why
        except Exception as exc:
            log.exception("channel %s: reading replies failed", self.address.name)
            why = repr(exc)
        with self._lock:
            self.lost = why
            futures, self._futures = list(self._futures.values()), {}
            pending, self._pending_puts = self._pending_puts, []
        err = self._lost_error(why)
        for fut in futures + [p[3] for p in pending]:
            if not fut.done():
                fut.set_exception(err)

    def _on_reply(self, control: tuple, inline: list, fds: list[int]) -> None:
        op = control[0]
        if op == "item":
            _, req, last, _weight, desc = control
            try:
                obj = unpack(Desc.from_wire(desc), inline, fds, self.cache)
            except Exception as exc:
                obj = _Undecodable(exc)
            with self._lock:
                batch = self._batches.setdefault(req, [])
                batch.append((_weight, obj))
                fut = self._futures.pop(req, None) if last else None
                if last:
                    del self._batches[req]
            if fut is not None:
                fut.set_result(batch)
        elif op == "grant":
            self._on_grant(control[2])
        elif op in ("stat", "cancelled"):
            with self._lock:
                fut = self._futures.pop(control[1], None)
            if fut is not None:
                fut.set_result(control[2] if op == "stat" else _CANCELLED)
        elif op == "error":
            _, req, kind, message = control
            err: Exception = ChannelClosed(message) if kind == "closed" else PeerDiedError(message)
            with self._lock:
                fut = self._futures.pop(req, None)
                if req == self._credit_req:
                    self._credit_req = None
                    pending, self._pending_puts = self._pending_puts, []
                    futs = [p[3] for p in pending]
                else:
                    futs = []
            for f in ([fut] if fut is not None else []) + futs:
                f.set_exception(err)
        elif op == "closed":
            with self._lock:
                self.closed = True
        elif op == "sync":  # everything this process put so far is ahead of this answer
            self._send(("synced",))

    def _on_grant(self, n: int) -> None:
        with self._lock:
            self._credit_req = None
            self._credits += n
            while self._pending_puts and self._credits > 0:
                control, inline, fds, fut = self._pending_puts.pop(0)
                self._credits -= 1
                try:
                    self._send(control, inline, fds)
                    fut.set_result(None)
                except PeerDiedError as exc:
                    fut.set_exception(exc)
            if self._pending_puts:
                self._credit_req = req = next(self._ids)
                self._send(("credit", req, min(_CREDIT_BATCH, self.address.maxsize)))

    # -- prefetched items ------------------------------------------------------------------------
    def take_local(self, key: Hashable) -> Any:
        with self._lock:
            q = self._local.get(key)
            return q.popleft()[1] if q else _MISS

    def take_local_batch(self, key: Hashable, target: float) -> tuple[list[Any], float, bool]:
        """Prefetched items towards ``target``: ``(items, weight, complete)``."""
        items: list[Any] = []
        weight = 0.0
        with self._lock:
            q = self._local.get(key)
            while q and (not items or weight + q[0][0] <= target):
                w, obj = q.popleft()
                items.append(obj)
                weight += w
            complete = bool(items) and (weight >= target or bool(q))
        return items, weight, complete

    def keep(self, key: Hashable, batch: list[tuple[float, Any]]) -> Any:
        """Return the first item of a reply and keep the rest for the next gets."""
        first = _unwrap_one(batch[:1])
        if len(batch) > 1:
            with self._lock:
                self._local.setdefault(key, deque()).extend(batch[1:])
        return first

    def _give_back(self) -> None:
        with self._lock:
            local, self._local = self._local, {}
        for key, q in local.items():
            for weight, obj in reversed(q):  # each goes to the front: last one first
                packed = pack(encode(obj), self.pool)
                self._send(("requeue", key, weight, packed.desc.to_wire()), packed.inline, packed.fds)

    def close(self) -> None:
        """Give prefetched items back to the channel and say goodbye."""
        try:
            if self.lost is None:
                self._give_back()
        except PeerDiedError:
            pass
        try:
            self.conn.send(("bye",))
        except ConnectionLost:
            pass
        self.conn.close()
        if self.pool is not None:
            self.pool.close()


class _Undecodable:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


_CANCELLED = object()
_MISS = object()
_CONNECTIONS: dict[tuple, _Connection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def _connection(address: ChannelAddress) -> _Connection:
    key = (address.name, address.unix_address, address.tcp_address)
    conn = _CONNECTIONS.get(key)
    if conn is None or conn.lost is not None:
        with _CONNECTIONS_LOCK:
            conn = _CONNECTIONS.get(key)
            if conn is None or conn.lost is not None:
                conn = _CONNECTIONS[key] = _Connection(address)
    return conn


def _unwrap_one(batch: list[tuple[float, Any]]) -> Any:
    ((_, obj),) = batch
    if isinstance(obj, _Undecodable):
        raise CommError(f"cannot decode a channel item: {obj.exc!r}") from obj.exc
    return obj


def _unwrap_many(batch: list[tuple[float, Any]]) -> list[Any]:
    out = []
    for _, obj in batch:
        if isinstance(obj, _Undecodable):
            raise CommError(f"cannot decode a channel item: {obj.exc!r}") from obj.exc
        out.append(obj)
    return out


def _close_all() -> None:
    with _CONNECTIONS_LOCK:
        conns = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for conn in conns:
        conn.close()


atexit.register(_close_all)  # a clean exit is not a dead producer, and prefetched items go back
