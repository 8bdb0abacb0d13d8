"""The process that owns one channel's queues: producers and consumers talk to it over sockets.

Puts are one-way frames (no reply), so a producer streams items without a round trip; a bounded
channel hands producers *credits* (free slots) in batches, which is how back-pressure reaches them
without a per-item acknowledgement. Consumers are fed the same way: a process blocked in ``get``
says so once, and a steady consumer grants a small window of items the host may push ahead of its
gets (``push.py``), so neither side waits a round trip per item. Tensor bytes never pass through
here on one node: a put carries a shared-memory segment descriptor and its file descriptor, which
the host forwards untouched to the consumer; only a consumer on another node makes the host copy
the bytes into the TCP stream.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from m2flow.runtime.channel.metrics import ChannelMetrics, DepthTrace
from m2flow.runtime.channel.push import _FLUSH_EVERY, Pusher
from m2flow.runtime.channel.state import Client, CreditWaiter, Item, Waiter
from m2flow.runtime.comm.payload import Desc, discard, inline_copy
from m2flow.runtime.comm.shm import SegmentCache
from m2flow.runtime.comm.wire import BufferPool, Connection, ConnectionLost, Listener, close_fds
from m2flow.runtime.trace import Tracer, get_tracer

log = logging.getLogger(__name__)
_ids = itertools.count()


class ChannelHost:
    """Queues, waiters and credits of one channel, served on a Unix socket and a TCP port."""

    def __init__(self, name: str, maxsize: int = 0, host_ip: str = "127.0.0.1", tracer: Tracer | None = None) -> None:
        """``tracer`` takes this channel's depth track; by default the tracer of whichever thread
        records (a host actor gives each of the channels it hosts a shard of its own)."""
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0: unbounded), got {maxsize}")
        self.name = name
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._queues: dict[Hashable, deque[Item]] = {}
        self._size = 0
        self._waiters: list[Waiter] = []
        self._credit_waiters: deque[CreditWaiter] = deque()
        self._clients: list[Client] = []
        self._closed = False
        self._closers: list[tuple[Client, int]] = []  # close requests waiting for the sync round
        self._unsynced: list[Client] = []
        self._dead: list[str] = []
        self._cache = SegmentCache()
        self._metrics = ChannelMetrics(name)
        self._push = Pusher(self)
        self._tracer = tracer
        self._trace = DepthTrace(counter=f"channel/{name}", tracer=tracer)  # depth track in a traced run
        self._listener = Listener(
            host_ip, self._on_accept, name=f"ch-{uuid.uuid4().hex[:12]}-{next(_ids)}", pool=BufferPool()
        )
        self.unix_address = self._listener.unix_address
        self.tcp_address = self._listener.tcp_address

    # -- connections ---------------------------------------------------------------------------
    def _on_accept(self, conn: Connection) -> None:
        client = Client(conn)
        with self._lock:
            self._clients.append(client)
        threading.Thread(target=self._serve, args=(client,), daemon=True, name=f"m2flow-ch-{self.name}").start()

    def _serve(self, client: Client) -> None:
        graceful = False
        bye: int | None = None
        unflushed = 0
        try:
            while True:
                control, inline, fds = client.conn.recv()
                op = control[0]
                if op == "put":
                    self._put(client, control, inline, fds)
                elif op == "took":
                    self._took(client, *control[1:])
                elif op == "want":
                    self._locked(self._push.want, client, *control[1:])
                elif op == "giveback":
                    self._locked(self._push.give_back, client, *control[1:])
                elif op == "stop":
                    self._locked(self._push.stop, client, control[2], control[1])
                elif op == "get":
                    self._get(client, *control[1:])
                elif op == "credit":
                    self._credit(client, *control[1:])
                elif op == "cancel":
                    self._cancel(client, control[1])
                elif op == "stat":
                    self._send(client, ("stat", control[1], self._stat(*control[2:])))
                elif op == "close":
                    self._close_request(client, control[1], control[2] if len(control) > 2 else True)
                elif op == "synced":
                    self._synced(client)
                elif op == "hello":
                    client.identity = control[1]
                elif op == "bye":
                    graceful, bye = True, control[1]
                    return
                # Replies wait while more frames are already buffered: one write then carries
                # the items a burst of puts produced (bounded, so a busy producer never starves them).
                unflushed += 1
                if self._push.dirty and (unflushed >= _FLUSH_EVERY or not client.conn.frame_ready()):
                    self._push.flush()
                    unflushed = 0
        except ConnectionLost:
            pass
        except Exception:
            log.exception("channel %s: serving %s failed", self.name, client.identity)
        finally:
            self._drop_client(client, graceful, bye)

    def _send(self, client: Client, control: Any, item: Item | None = None) -> None:
        try:
            if item is None:
                client.conn.send(control)
            elif client.conn.unix or isinstance(item.desc, bytes):  # same node, or a bare pickle
                client.conn.send((*control, item.desc), item.inline, item.fds)
                close_fds(item.fds)
            else:  # another node: the bytes must travel in the stream
                desc, buffers = inline_copy(Desc.from_wire(item.desc), item.inline, item.fds, self._cache)
                client.conn.send((*control, desc.to_wire()), buffers)
        except ConnectionLost:
            pass  # the reader of that connection cleans up

    def _drop_client(self, client: Client, graceful: bool, bye: int | None = None) -> None:
        with self._lock:
            if client in self._clients:
                self._clients.remove(client)
            client.credits = 0
            self._credit_waiters = deque(w for w in self._credit_waiters if w.client is not client)
            for w in [w for w in self._waiters if w.client is client]:
                self._waiters.remove(w)
                for item in reversed(w.taken):  # a consumer died mid-batch: nothing is lost
                    self._queues.setdefault(w.key, deque()).appendleft(item)
                    self._size += 1
            if client.puts and not graceful and not self._closed:
                self._dead.append(client.identity)
                log.warning("channel %s: producer %s died", self.name, client.identity)
            if client in self._unsynced:
                self._unsynced.remove(client)
            self._push.drop(client)
            sync_done = bool(self._closers) and not self._unsynced
            actions = self._progress()
        if bye is not None:  # its untaken items are queued again: the goodbye is answered
            self._send(client, ("stat", bye, None))
        client.conn.close()
        self._run(actions)
        self._push.flush()
        if sync_done:
            self.close()

    # -- operations ----------------------------------------------------------------------------
    def _put(self, client: Client, control: tuple, inline: list, fds: list[int]) -> None:
        _, key, weight, desc = control
        nbytes = 0 if isinstance(desc, bytes) else sum(spec[1] for spec in desc[1])
        item = Item(weight, desc, inline, fds, nbytes)
        with self._lock:
            client.puts += 1
            if self.maxsize:
                client.credits = max(0, client.credits - 1)
            if self._closed:
                log.warning("channel %s: dropped an item put after close by %s", self.name, client.identity)
                _discard(desc, fds, self._cache)
                return
            self._queues.setdefault(key, deque()).append(item)
            self._size += 1
            self._metrics.items_in += 1
            self._metrics.bytes_in += nbytes
            self._metrics.max_depth = max(self._metrics.max_depth, self._size)
            self._trace.record(self._size)
            actions = self._progress()
        self._run(actions)

    def _locked(self, op: Callable[..., None], *args: Any) -> None:
        """Run one push-side operation under the lock, then whatever it made possible."""
        with self._lock:
            op(*args)
            actions = self._progress()
        self._run(actions)

    def _took(self, client: Client, key: Hashable, through: int) -> None:
        with self._lock:
            self._metrics.items_out += self._push.took(client, key, through)
            actions = self._progress()
        self._run(actions)

    def _get(self, client: Client, req: int, key: Hashable, target: float, base: float = 0.0) -> None:
        """A batch get: items of ``key`` until their weight, with ``base`` already held, reaches ``target``."""
        with self._lock:
            self._waiters.append(Waiter(client, req, key, target, time.monotonic(), base))
            actions = self._progress()
        self._run(actions)

    def _credit(self, client: Client, req: int, want: int) -> None:
        with self._lock:
            if self._closed:
                actions = [lambda: self._send(client, ("error", req, "closed", f"channel {self.name!r} is closed"))]
            else:
                self._credit_waiters.append(CreditWaiter(client, req, max(1, want), time.monotonic()))
                actions = self._progress()
        self._run(actions)

    def _cancel(self, client: Client, req: int) -> None:
        with self._lock:
            waiter = next((w for w in self._waiters if w.client is client and w.req == req), None)
            if waiter is not None:
                self._waiters.remove(waiter)
                for item in reversed(waiter.taken):
                    self._queues.setdefault(waiter.key, deque()).appendleft(item)
                    self._size += 1
        if waiter is not None:
            self._send(client, ("cancelled", req))

    def _stat(self, what: str, key: Hashable = None) -> Any:
        with self._lock:
            # Items pushed to a consumer and not yet taken by a get are still in the channel.
            if what == "qsize":
                return len(self._queues.get(key, ())) + self._push.held_of(key)
            if what == "total":
                return self._size + self._push.held
            if what == "full":
                return bool(self.maxsize) and self._size + self._push.held >= self.maxsize
            if what == "keys":
                held = {k for c in self._clients for k, h in c.held.items() if h}
                return [k for k, q in self._queues.items() if q or k in held] + [
                    k for k in held if k not in self._queues
                ]
            if what == "closed":
                return self._closed
            if what == "metrics":
                m = self._metrics
                return ChannelMetrics(
                    m.name, m.items_in, m.items_out, m.bytes_in, m.max_depth,
                    m.put_wait, m.get_wait, list(self._trace.samples),
                )
        raise ValueError(f"unknown channel statistic {what!r}")

    def _close_request(self, closer: Client, req: int, sync: bool = True) -> None:
        """Close after every put that any client sent before this request (``sync``), or at once.

        Puts are one-way, so a producer's last put may still be in its socket when another process
        asks to close. Each client answers a sync marker on the connection its puts travel on;
        once all have answered, everything they had sent before has been queued. A client that
        never answers (a frozen process) holds that close back until its connection drops: a
        teardown asks without ``sync``.
        """
        if not sync:
            with self._lock:
                already = self._closed
                if not already:
                    self._closers.append((closer, req))  # ``close`` answers every closer, this one too
            if already:
                self._send(closer, ("stat", req, True))
            else:
                self.close()
            return
        with self._lock:
            if self._closed:
                done = True
            else:
                done = False
                self._closers.append((closer, req))
                starting = len(self._closers) == 1
                if starting:
                    self._unsynced = list(self._clients)
                clients = list(self._unsynced) if starting else []
        if done:
            self._send(closer, ("stat", req, True))
            return
        for client in clients:
            self._send(client, ("sync",))

    def _synced(self, client: Client) -> None:
        with self._lock:
            if client in self._unsynced:
                self._unsynced.remove(client)
            ready = bool(self._closers) and not self._unsynced
        if ready:
            self.close()

    def close(self) -> None:
        """End of stream: consumers drain what is queued, then get ``ChannelClosed``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            clients = list(self._clients)
            closers, self._closers = self._closers, []
            actions = self._progress()
        # The depth track reaches the trace shard before the closer's close() returns: a run
        # closes its channels, then merges the trace.
        (self._tracer or get_tracer()).flush()
        for client in clients:
            self._send(client, ("closed",))
        for closer, req in closers:
            self._send(closer, ("stat", req, True))
        self._run(actions)
        self._push.flush()

    # -- matching waiters with items (called with the lock held; returns sends to run after) ----
    def _progress(self) -> list[Callable[[], None]]:
        actions: list[Callable[[], None]] = []
        now = time.monotonic()
        for w in list(self._waiters):
            q = self._queues.get(w.key)
            while q and self._fits(w, q[0]):
                item = q.popleft()
                self._size -= 1
                w.taken.append(item)
                w.weight += item.weight
            done = self._complete(w, q)
            if done is None:
                continue
            self._waiters.remove(w)
            self._metrics.get_wait.add(now - w.since)
            self._metrics.items_out += len(w.taken)
            actions.append(self._reply(w, done))
        self._push.feed()
        if self._size != (self._trace.samples[-1][1] if self._trace.samples else 0):
            self._trace.record(self._size)
        actions.extend(self._grant(now))
        return actions

    @staticmethod
    def _fits(w: Waiter, item: Item) -> bool:
        return not w.holds or w.base + w.weight + item.weight <= w.target

    def _complete(self, w: Waiter, q: deque | None) -> str | None:
        """``"items"``, ``"closed"``, ``"died"``, or None to keep waiting."""
        if w.holds:
            total = w.base + w.weight
            if total >= w.target or (q and total + q[0].weight > w.target):
                return "items"
        if self._closed:
            return "items" if w.holds else "closed"
        if self._dead:
            return "items" if w.holds else "died"
        return None

    def _reply(self, w: Waiter, outcome: str) -> Callable[[], None]:
        client, req = w.client, w.req
        if outcome == "closed":
            return lambda: self._send(client, ("error", req, "closed", f"channel {self.name!r} is closed"))
        if outcome == "died":
            who = ", ".join(self._dead)
            msg = f"channel {self.name!r} is empty and its producer {who} died"
            return lambda: self._send(client, ("error", req, "died", msg))
        items = list(w.taken)
        if not items:  # a batch completed by what the consumer already held
            return lambda: self._send(client, ("stat", req, []))

        def send() -> None:
            for i, item in enumerate(items):
                self._send(client, ("item", req, i + 1 == len(items), item.weight), item)

        return send

    def _grant(self, now: float) -> list[Callable[[], None]]:
        if not self._credit_waiters:
            return []
        if not self.maxsize:
            free = None
        else:
            free = self.maxsize - self._size - self._push.held - sum(c.credits for c in self._clients)
        actions = []
        # A lone producer gets all that is free; with several, half, so the next still finds room.
        alone = free is not None and sum(1 for c in self._clients if c.puts) <= 1
        while self._credit_waiters and (free is None or free > 0):
            cw = self._credit_waiters.popleft()
            n = cw.want if free is None else min(cw.want, free if alone else max(1, (free + 1) // 2))
            if free is not None:
                free -= n
                cw.client.credits += n
            self._metrics.put_wait.add(now - cw.since)
            client, req = cw.client, cw.req
            actions.append(lambda c=client, r=req, k=n: self._send(c, ("grant", r, k)))
        if self._closed:
            while self._credit_waiters:
                cw = self._credit_waiters.popleft()
                actions.append(lambda c=cw.client, r=cw.req: self._send(c, ("error", r, "closed", f"channel {self.name!r} is closed")))
        return actions

    @staticmethod
    def _run(actions: list[Callable[[], None]]) -> None:
        for act in actions:
            act()

    def shutdown(self) -> None:
        """Stop serving and release every queued item's shared memory."""
        self._listener.close()
        with self._lock:
            clients, self._clients = self._clients, []
            items = [item for q in self._queues.values() for item in q]
            items += [item for c in clients for h in c.held.values() for _, item in h]
            self._queues.clear()
            self._size = 0
        for client in clients:
            client.conn.close()
        for item in items:
            _discard(item.desc, item.fds, self._cache)


def _discard(desc: tuple | bytes, fds: list[int], cache: SegmentCache) -> None:
    if not isinstance(desc, bytes):  # a bare pickle has no segment to release
        discard(Desc.from_wire(desc), fds, cache)
