"""Feeding plain gets: the host pushes items to consumer processes instead of answering requests.

A process whose ``get`` finds nothing locally sends one ``want``: how many of its gets are blocked
on the key, the last item it has received, and how many untaken items it accepts ahead of its gets
(its *window*, grown by the consumer each time it runs dry). The host then pushes queued items:
first one by one to blocked processes, then ahead into windows. Items pushed ahead stay *held* by
the host (counted in the channel's size and capacity, their shared memory kept) until the consumer
reports it took them, so:

- back-pressure is unchanged: a held item occupies its slot until a get returns it;
- a consumer that dies or disconnects loses nothing: what it held and had not taken is queued
  again, at the front, in order;
- a process blocked on a key while another holds untaken items of that key *recalls* them, so a
  window never starves another consumer (two ranks taking one item each per step still work).

Every push carries a per-(process, key) sequence number: reports ("took through n") and give-backs
("these numbers") name items exactly, whatever order the two kinds of frame arrive in.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Hashable
from typing import Any

from m2flow.runtime.channel.state import Client, HostState, Item
from m2flow.runtime.comm.payload import Desc, discard, inline_copy
from m2flow.runtime.comm.wire import _MAX_FDS, ConnectionLost, close_fds


_FLUSH_EVERY = 16  # frames a busy connection reads before the host writes what they produced


class Pusher:
    """The push side of a ``ChannelHost``; every method but ``flush`` runs with the host's lock held."""

    def __init__(self, host: HostState) -> None:
        self.host = host
        self.held = 0  # items pushed to consumers and not yet reported taken, all keys
        self.dirty: set[Client] = set()

    # -- consumer messages ---------------------------------------------------------------------
    def want(self, c: Client, key: Hashable, seen: int, waiting: int, window: int) -> None:
        """A snapshot of ``c``'s gets on ``key``: ``waiting`` blocked, ``seen`` the last item received."""
        c.window[key] = max(0, window)
        c.recalled.discard(key)
        in_flight = c.seq.get(key, 0) - seen  # already on their way: they feed blocked gets first
        c.hungry[key] = max(0, waiting - in_flight)

    def took(self, c: Client, key: Hashable, through: int) -> int:
        """``c`` took every item of ``key`` up to number ``through``; returns how many that was."""
        held = c.held.get(key)
        n = 0
        while held and held[0][0] <= through:
            _, item = held.popleft()
            if item.fds and not c.conn.unix:
                # It went there as a copy: its segment is free for the producer only now. (A
                # consumer on this node got the descriptors and releases it itself.)
                discard(Desc.from_wire(item.desc), item.fds, self.host._cache)
            else:
                close_fds(item.fds)
            n += 1
        self.held -= n
        return n

    def give_back(self, c: Client, key: Hashable, seqs: list[int]) -> None:
        """``c`` returns untaken items: they go back to the front of the queue, in order."""
        back = set(seqs)
        held = c.held.get(key, deque())
        items = [item for s, item in held if s in back]
        c.held[key] = deque((s, item) for s, item in held if s not in back)
        self._requeue(key, items)

    def stop(self, c: Client, key: Hashable, req: int) -> None:
        """No more pushes ahead on ``key``; the answer follows every item already pushed."""
        c.window[key] = 0
        self._out(c, ("stat", req, None))

    def drop(self, c: Client) -> None:
        """``c`` is gone: whatever it held and had not taken is queued again."""
        for key, held in c.held.items():
            self._requeue(key, [item for _, item in held])
        c.held.clear()
        c.hungry.clear()
        c.window.clear()
        c.outbox.clear()
        self.dirty.discard(c)

    def _requeue(self, key: Hashable, items: list[Item]) -> None:
        if not items:
            return
        self.host._queues.setdefault(key, deque()).extendleft(reversed(items))
        self.host._size += len(items)
        self.held -= len(items)

    # -- matching --------------------------------------------------------------------------------
    def held_of(self, key: Hashable) -> int:
        return sum(len(c.held.get(key, ())) for c in self.host._clients)

    def feed(self) -> None:
        """Push queued items to blocked gets, then ahead into windows; recall or end for the starved."""
        host = self.host
        clients = [c for c in host._clients if c.hungry or c.window]
        if not clients:
            return
        queues = host._queues
        batching = {w.key for w in host._waiters}  # a waiting get_batch is served first
        starved: list[tuple[Client, Hashable]] = []
        again = True
        while again:  # blocked gets: one item per process per round, so they share fairly
            again = False
            for c in clients:
                for key, n in c.hungry.items():
                    if not n:
                        continue
                    q = queues.get(key)
                    if not q:
                        starved.append((c, key))
                    elif key not in batching:
                        self._push(c, key, q.popleft())
                        c.hungry[key] = n - 1
                        again = True
        for key, q in queues.items():  # ahead of gets, round robin over open windows
            if not q or key in batching:
                continue
            takers = [c for c in clients if c.window.get(key, 0) > len(c.held.get(key, ()))]
            while q and takers:
                for c in list(takers):
                    if not q:
                        break
                    self._push(c, key, q.popleft())
                    if len(c.held[key]) >= c.window[key]:
                        takers.remove(c)
        for c, key in starved:
            if c.hungry.get(key) and not queues.get(key):
                self._starving(c, key, clients)
        for w in host._waiters:
            if not queues.get(w.key):
                self._recall(w.client, w.key, clients)

    def _push(self, c: Client, key: Hashable, item: Item) -> None:
        seq = c.seq[key] = c.seq.get(key, 0) + 1
        c.held.setdefault(key, deque()).append((seq, item))
        self.host._size -= 1
        self.held += 1
        self._out(c, ("push", key, seq, item))

    def _recall(self, starving: Client, key: Hashable, clients: list[Client]) -> bool:
        """Ask processes that hold untaken items of ``key`` to give them back; True if any holds."""
        holds = False
        for d in clients:
            if d is starving or not d.held.get(key):
                continue
            holds = True
            if key not in d.recalled and not d.hungry.get(key):
                d.recalled.add(key)
                d.window[key] = 0
                self._out(d, ("recall", key))
        return holds

    def _starving(self, c: Client, key: Hashable, clients: list[Client]) -> None:
        host = self.host
        if self._recall(c, key, clients) or c.held.get(key):
            return  # items are on their way or coming back: not the end yet
        if host._closed:
            msg = f"channel {host.name!r} is closed"
            kind = "closed"
        elif host._dead:
            msg = f"channel {host.name!r} is empty and its producer {', '.join(host._dead)} died"
            kind = "died"
        else:
            return
        c.hungry[key] = 0
        self._out(c, ("end", key, kind, msg))

    def _out(self, c: Client, msg: tuple) -> None:
        c.outbox.append(msg)
        self.dirty.add(c)

    # -- writing (without the host's lock) -------------------------------------------------------
    def flush(self) -> None:
        """Write every pending outbox, pushes of one client coalesced into few frames."""
        host = self.host
        with host._lock:
            dirty, self.dirty = list(self.dirty), set()
        for c in dirty:
            with c.flush_lock:  # outboxes are taken and written in order
                with host._lock:
                    out, c.outbox = c.outbox, []
                if out:
                    try:
                        self._write(c, out)
                    except ConnectionLost:
                        pass  # the reader of that connection cleans up

    def _write(self, c: Client, out: list[tuple]) -> None:
        conn = c.conn
        entries: list[tuple] = []
        bufs: list[Any] = []
        fds: list[int] = []
        for msg in out:
            if msg[0] != "push":
                if entries:
                    conn.send(("push", entries), bufs, fds)
                    entries, bufs, fds = [], [], []
                conn.send(msg)
                continue
            _, key, seq, item = msg
            desc, inline, ifds = item.desc, item.inline, item.fds
            if ifds and not conn.unix:  # another node: the bytes travel in the stream
                # Mapping consumes the descriptors it is given; the held item keeps its own, and
                # the producer's segment stays in use, since the item may still be given back and
                # pushed elsewhere. Both end when the consumer reports it taken (`took`).
                d, inline = inline_copy(Desc.from_wire(desc), inline, [os.dup(f) for f in ifds], self.host._cache,
                                        release=False)
                desc, ifds = d.to_wire(), []
            if entries and len(fds) + len(ifds) > _MAX_FDS:
                conn.send(("push", entries), bufs, fds)
                entries, bufs, fds = [], [], []
            entries.append((key, seq, item.weight, desc, len(inline), len(ifds)))
            bufs.extend(inline)
            fds.extend(ifds)
        if entries:
            conn.send(("push", entries), bufs, fds)

