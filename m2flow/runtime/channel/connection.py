"""This process's connection to one channel host: requests, replies, credits and pushed items.

One connection per (process, channel) is shared by every handle and thread; a reader thread
resolves each request's future from the host's replies and files the items the host pushes
(``push.py`` on the host side) into per-key boxes, from which plain gets take them without asking.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import pickle
import threading
from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from m2flow.runtime.comm.communicator import PROCESS_UID, _node_id
from m2flow.runtime.comm.errors import CommError, PeerDiedError
from m2flow.runtime.comm.payload import Desc, pack, unpack
from m2flow.runtime.comm.rendezvous import HOSTNAME
from m2flow.runtime.comm.serialization import encode
from m2flow.runtime.comm.shm import SegmentCache, SegmentPool
from m2flow.runtime.comm.wire import BufferPool, Connection, ConnectionLost, close_fds, connect

log = logging.getLogger(__name__)

_CREDIT_BATCH = 64  # slots a producer asks for at once on a bounded channel
_MAX_WINDOW = 32  # most items a consumer lets the host push ahead of its gets, per key


class ChannelClosed(Exception):
    """The channel was closed and (for a get) everything put before the close has been taken."""


@dataclass(frozen=True)
class ChannelAddress:
    """Where a channel's host listens, and its capacity; a host in a Ray actor also gives the
    actor's name and the channel's key in it (one actor hosts the channels of one creator)."""

    name: str
    node_id: str
    unix_address: tuple
    tcp_address: tuple
    maxsize: int
    actor_name: str | None = None
    host_key: str | None = None


@dataclass
class _Box:
    """One key's items pushed to this process and not yet taken, and the gets waiting for them."""

    items: deque = field(default_factory=deque)  # (seq, weight, (desc, inline, fds)), oldest first
    getters: deque = field(default_factory=deque)  # futures of blocked gets, oldest first
    seen: int = 0  # sequence number of the last item received
    window: int = 0  # items the host may push ahead of this process's gets
    batching: int = 0  # get_batch calls in progress: no pushes ahead meanwhile, they would overtake
    settling: Future | None = None  # the host's answer to the last "stop", once all pushes are here
    told: int = 0  # the last item the host knows was taken


def _identity() -> str:
    # A rank process names the rank it serves (``rank_host.RANK_ENV``); another Ray actor its Ray name.
    name = os.environ.get("M2FLOW_RANK")
    try:
        import ray

        if not name and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
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
        self._boxes: dict[Hashable, _Box] = {}
        # Half the capacity at most, so held items never fill a bounded channel by themselves.
        self._max_window = min(_MAX_WINDOW, max(1, address.maxsize // 2)) if address.maxsize else _MAX_WINDOW
        threading.Thread(target=self._read, daemon=True, name=f"m2flow-chc-{address.name}").start()

    # -- requests ------------------------------------------------------------------------------
    def request(self, control: tuple) -> tuple[int, Future]:
        with self._lock:
            return self._request_locked(control)

    def _request_locked(self, control: tuple) -> tuple[int, Future]:
        req = next(self._ids)
        fut: Future = Future()
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

    def put(self, item: Any, weight: float, key: Hashable) -> Future | None:
        """Send ``item`` now (returns None) or once credits come (returns the future of that)."""
        enc = encode(item)
        if not enc.specs and not enc.gpu:  # plain Python: the pickle is the whole payload
            control, inline, fds = ("put", key, weight, enc.meta), [], []
        else:
            packed = pack(enc, self.pool)
            control, inline, fds = ("put", key, weight, packed.desc.to_wire()), packed.inline, packed.fds
        with self._lock:
            self._check()
            if self.closed:
                raise ChannelClosed(f"channel {self.address.name!r} is closed")
            if not self.address.maxsize or (self._credits > 0 and not self._pending_puts):
                self._credits -= 1
                self._send(control, inline, fds)  # under the lock: puts stay in order
                return None
            fut: Future = Future()
            self._pending_puts.append((control, inline, fds, fut))
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
            for box in self._boxes.values():
                futures.extend(box.getters)
                box.getters.clear()
        err = self._lost_error(why)
        for fut in futures + [p[3] for p in pending]:
            if not fut.done():
                fut.set_exception(err)

    def _on_reply(self, control: tuple, inline: list, fds: list[int]) -> None:
        op = control[0]
        if op == "push":
            self._on_push(control[1], inline, fds)
        elif op == "recall":
            self._on_recall(control[1])
        elif op == "end":
            _, key, kind, message = control
            with self._lock:
                box = self._boxes.get(key)
                getters = list(box.getters) if box is not None else []
                if box is not None:
                    box.getters.clear()
            for fut in getters:
                fut.set_exception(ChannelClosed(message) if kind == "closed" else PeerDiedError(message))
        elif op == "item":
            _, req, last, _weight, desc = control
            try:
                obj = self.decode((desc, inline, fds))
            except CommError as exc:
                obj = _Undecodable(exc.__cause__ or exc)
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

    # -- pushed items ----------------------------------------------------------------------------
    def _on_push(self, entries: list[tuple], inline: list, fds: list[int]) -> None:
        fed: dict[Hashable, int] = {}
        handed: list[tuple[Future, tuple]] = []
        i = f = 0
        with self._lock:
            for key, seq, weight, desc, n_inline, n_fds in entries:
                raw = (desc, inline[i : i + n_inline], fds[f : f + n_fds])
                i, f = i + n_inline, f + n_fds
                box = self._boxes.get(key)
                if box is None:
                    box = self._boxes[key] = _Box()
                box.seen = seq
                if box.getters:  # a blocked get takes it at once
                    handed.append((box.getters.popleft(), raw))
                    fed[key] = box.told = seq
                else:
                    box.items.append((seq, weight, raw))
        for key, seq in fed.items():  # what blocked gets took comes first in each box: one report
            self._report(key, seq)
        for fut, raw in handed:
            fut.set_result(raw)

    def _report(self, key: Hashable, seq: int) -> None:
        try:
            self._send(("took", key, seq))
        except PeerDiedError:
            pass  # the next request says so

    def _on_recall(self, key: Hashable) -> None:
        """Another process is blocked on ``key``: hand back what was pushed here and is untaken."""
        with self._lock:
            box = self._boxes.get(key)
            if box is None:
                return
            # Takes not yet reported come first: the starving process may be waiting for the end
            # of the stream, which the host only sends once nothing of this key is held anywhere.
            owed = _owed(box)
            if owed:
                self._send(("took", key, owed))
            back, box.items = list(box.items), deque()
            box.window = max(1, box.window // 2)  # hoarding starved someone: ask for less
            if back:
                self._send(("giveback", key, [seq for seq, _, _ in back]))
        for _, _, raw in back:
            close_fds(raw[2])

    def take(self, key: Hashable, min_window: int) -> tuple[Any, Future | None]:
        """``(item, None)`` when one was pushed here already, else ``(None, future of its raw form)``."""
        with self._lock:
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = _Box()
            if not box.items:
                self._check()
                owed = _owed(box)  # a process about to block owes the host no report
                if owed:
                    self._send(("took", key, owed))
                fut: Future = Future()
                box.getters.append(fut)
                # Running dry means the window was too small for this consumer's pace.
                grown = min(max(min_window, box.window * 2, 1), max(min_window, self._max_window))
                box.window = 0 if box.batching else grown
                self._want(key, box)
                return None, fut
            seq, _, raw = box.items.popleft()
            # Takes are reported in runs (each report frees capacity and costs the host a frame),
            # and always when the box runs empty, so a consumer about to block owes nothing.
            report = not box.items or seq - box.told >= max(1, box.window // 2)
            if report:
                box.told = seq
        if report:
            self._report(key, seq)
        return self.decode(raw), None

    def report_all(self) -> None:
        """Tell the host about every take not yet reported (before a statistic, or goodbye)."""
        with self._lock:
            owed = [(key, seq) for key, box in self._boxes.items() if (seq := _owed(box))]
        for key, seq in owed:
            self._report(key, seq)

    def _want(self, key: Hashable, box: _Box) -> None:
        # Sent under the lock: the host keeps only the latest snapshot, so they must arrive in order.
        self._send(("want", key, box.seen, len(box.getters), box.window))

    def withdraw(self, key: Hashable, fut: Future) -> bool:
        """Take back a blocked get after its timeout; False if an item already reached it."""
        with self._lock:
            box = self._boxes.get(key)
            if box is None or fut not in box.getters:
                return False
            box.getters.remove(fut)
            if self.lost is None:
                self._want(key, box)
            return True

    def begin_batch(self, key: Hashable) -> None:
        """Stop pushes ahead on ``key`` until ``end_batch``, and wait for everything pushed so far.

        A get_batch takes what was pushed here first, then asks the host for the rest: an item
        pushed ahead while that request is out would arrive after later items.
        """
        with self._lock:
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = _Box()
            box.batching += 1
            if box.window or box.getters:
                box.settling = self._request_locked(("stop", key))[1]
            box.window = 0
            settling = box.settling
        if settling is not None:  # another thread's stop counts as well: its pushes may be in flight
            try:
                settling.result(timeout=60)
            except BaseException:
                self.end_batch(key)
                raise

    def end_batch(self, key: Hashable) -> None:
        with self._lock:
            self._boxes[key].batching -= 1

    def take_batch(self, key: Hashable, target: float) -> tuple[list[Any], float, bool]:
        """Items already here towards ``target``: ``(items, weight, complete)``."""
        taken: list[tuple] = []
        weight = 0.0
        with self._lock:
            box = self._boxes.get(key)
            q = box.items if box is not None else deque()
            while q and (not taken or weight + q[0][1] <= target):
                entry = q.popleft()
                taken.append(entry)
                weight += entry[1]
            complete = bool(taken) and (weight >= target or bool(q))
        if taken:
            with self._lock:
                box.told = max(box.told, taken[-1][0])
            self._report(key, taken[-1][0])
        return [self.decode(raw) for _, _, raw in taken], weight, complete

    def decode(self, raw: tuple) -> Any:
        desc, inline, fds = raw
        try:
            if isinstance(desc, bytes):
                return pickle.loads(desc)
            return unpack(Desc.from_wire(desc), inline, fds, self.cache)
        except Exception as exc:
            raise CommError(f"cannot decode a channel item: {exc!r}") from exc

    def close(self) -> None:
        """Say goodbye: the host queues again what was pushed here and not taken, then answers."""
        if self.lost is None:
            try:
                self.report_all()  # what was taken must not be queued again
                req, fut = self.request(("bye",))
                fut.result(timeout=10)  # a new connection's gets must find those items queued
            except Exception:
                pass  # the host is gone, or slow: it requeues them when it reads the goodbye
        self.conn.close()
        with self._lock:
            leftovers = [raw for box in self._boxes.values() for _, _, raw in box.items]
            self._boxes.clear()
        for raw in leftovers:
            close_fds(raw[2])
        if self.pool is not None:
            self.pool.close()


def _owed(box: _Box) -> int:
    """The last item of ``box`` taken but not yet reported to the host (0: none); now counted as told.

    Every item received before the oldest one still in the box was taken by a get or given back.
    """
    last = box.items[0][0] - 1 if box.items else box.seen
    if last <= box.told:
        return 0
    box.told = last
    return last


class _Undecodable:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


_CANCELLED = object()
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
