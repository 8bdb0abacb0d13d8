"""What a channel host keeps per item, client and waiting request; shared by ``host.py`` and ``push.py``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from m2flow.runtime.comm.shm import SegmentCache
from m2flow.runtime.comm.wire import Connection


@dataclass
class Item:
    weight: float
    desc: tuple | bytes  # Desc in wire form, or just the pickled object when it has no buffers
    inline: list
    fds: list[int]
    nbytes: int


@dataclass(eq=False)  # compared by identity: a client is one connection
class Client:
    conn: Connection
    identity: str = "?"
    puts: int = 0
    credits: int = 0  # granted and not yet used
    # Feeding plain gets (see push.py), per key:
    hungry: dict[Hashable, int] = field(default_factory=dict)  # gets blocked there, not yet fed
    window: dict[Hashable, int] = field(default_factory=dict)  # untaken items it accepts ahead
    held: dict[Hashable, deque] = field(default_factory=dict)  # (seq, Item) pushed, not yet taken
    seq: dict[Hashable, int] = field(default_factory=dict)  # last sequence number pushed
    recalled: set = field(default_factory=set)  # keys whose held items were asked back
    outbox: list = field(default_factory=list)  # frames to write at the next flush, in order
    flush_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Waiter:
    client: Client
    req: int
    key: Hashable
    target: float  # total weight the batch reaches (plain gets are fed by push.py)
    since: float
    base: float = 0.0  # weight the consumer already holds towards ``target`` (its prefetch)
    taken: list[Item] = field(default_factory=list)
    weight: float = 0.0

    @property
    def holds(self) -> bool:
        return bool(self.taken) or self.base > 0


@dataclass
class CreditWaiter:
    client: Client
    req: int
    want: int
    since: float


class HostState(Protocol):
    """The parts of a ``ChannelHost`` its pusher reads and updates (under ``_lock``)."""

    name: str
    _lock: threading.Lock
    _queues: dict[Hashable, deque[Item]]
    _size: int
    _clients: list[Client]
    _waiters: list[Waiter]
    _closed: bool
    _dead: list[str]
    _cache: SegmentCache
