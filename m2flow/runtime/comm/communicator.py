"""``Communicator``: one rank's point-to-point endpoint, choosing a transport per destination.

Each communicator listens on an abstract Unix socket and a TCP port and publishes both in the
rendezvous (Ray's KV). A destination's connection is opened on the first send and reused, so a
pair of ranks exchanges messages over one ordered stream; a small object costs one socket write
and one read, with no Ray call per message. See ``transport.py`` for the transport table.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from m2flow.runtime.comm.errors import CommError, PeerClosedError, PeerDiedError
from m2flow.runtime.comm.payload import Desc, Packed, pack, unpack
from m2flow.runtime.comm.rendezvous import (
    HOSTNAME,
    PeerRecord,
    Rendezvous,
    default_rendezvous,
    lookup_record,
    pid_alive,
    publish_record,
    record_key,
    wait_record,
)
from m2flow.runtime.comm.serialization import encode
from m2flow.runtime.comm.shm import SegmentCache, SegmentPool
from m2flow.runtime.comm.transport import LinkKind, LocalTransport, SocketTransport, Transport
from m2flow.runtime.comm.wire import BufferPool, Connection, ConnectionLost, Listener
from m2flow.runtime.comm.work import CommWork, Inbox, done_work

log = logging.getLogger(__name__)

PROCESS_UID = uuid.uuid4().hex
_LOCAL: dict[tuple[str, str, int], Communicator] = {}
_LOCAL_LOCK = threading.Lock()
_ids = itertools.count()

Peer = tuple[str, int]


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # no Ray, or not connected: the host is the node
        pass
    return f"host:{HOSTNAME}"


def _cuda_uuids() -> tuple[str, ...]:
    try:
        import torch

        if not torch.cuda.is_available():
            return ()
        return tuple(str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count()))
    except Exception:
        return ()


class Communicator:
    """Send, receive and broadcast between ranks of worker groups.

    ``transport`` forces a kind for every non-local destination (``"tcp"``; default ``"auto"``,
    or ``$M2FLOW_COMM_TRANSPORT``). ``world_size`` lets others broadcast to "all ranks" of this group.
    """

    def __init__(
        self,
        group_name: str,
        rank: int,
        node_ip: str = "127.0.0.1",
        namespace: str = "default",
        *,
        world_size: int | None = None,
        rendezvous: Rendezvous | None = None,
        transport: str | None = None,
        connect_timeout: float = 300.0,
    ) -> None:
        self.group = group_name
        self.rank = rank
        self.namespace = namespace
        self.closed = False
        self.connect_timeout = connect_timeout
        self._policy = transport or os.environ.get("M2FLOW_COMM_TRANSPORT", "auto")
        if self._policy not in ("auto", "tcp"):
            raise ValueError(f"transport must be 'auto' or 'tcp', not {self._policy!r}")
        self._rdv = rendezvous or default_rendezvous(namespace)
        self._lock = threading.Lock()
        self._dst_locks: dict[Peer, threading.Lock] = {}
        self._links: dict[Peer, Transport] = {}
        self._inboxes: dict[Peer, Inbox] = {}
        self._executors: dict[Peer, ThreadPoolExecutor] = {}
        self._pending: dict[Peer, int] = {}
        self._accepted: list[Connection] = []
        owner = f"{PROCESS_UID}:{group_name}:{rank}"
        self._pool = SegmentPool(owner)
        self._cache = SegmentCache()
        self._listener = Listener(
            node_ip or "127.0.0.1", self._on_accept, name=f"{PROCESS_UID[:12]}-{next(_ids)}", pool=BufferPool()
        )
        self.record = PeerRecord(
            group=group_name,
            rank=rank,
            process_uid=PROCESS_UID,
            pid=os.getpid(),
            hostname=HOSTNAME,
            node_id=_node_id(),
            unix_address=self._listener.unix_address,
            tcp_address=self._listener.tcp_address,
            world_size=world_size,
            cuda_uuids=_cuda_uuids(),
        )
        with _LOCAL_LOCK:
            _LOCAL[(namespace, group_name, rank)] = self
        publish_record(self._rdv, self.record)

    def __repr__(self) -> str:
        return f"Communicator({self.group}[{self.rank}])"

    # -- sending ------------------------------------------------------------------------------
    def send(self, obj: Any, dst_group: str, dst_rank: int, async_op: bool = False) -> CommWork | None:
        """Send ``obj`` to ``dst_group[dst_rank]``; returns once it is handed to the transport.

        With ``async_op`` a ``CommWork`` comes back; do not modify the payload's tensors before
        it completes. Within one process the receiver gets ``obj`` itself, not a copy.
        """
        return self._dispatch(obj, dst_group, [dst_rank], async_op)

    def broadcast(
        self, obj: Any, dst_group: str, dst_ranks: Sequence[int] | None = None, async_op: bool = False
    ) -> CommWork | None:
        """Send ``obj`` to several ranks; same-node receivers share one shared-memory copy.

        ``dst_ranks=None`` means every rank of ``dst_group`` (its communicators must have been
        created with ``world_size``). Receivers call ``recv`` as for any message.
        """
        if dst_ranks is None:
            record = wait_record(self._rdv, dst_group, 0, self.connect_timeout)
            if record.world_size is None:
                raise CommError(f"give dst_ranks: {dst_group} did not publish its world size")
            dst_ranks = range(record.world_size)
        return self._dispatch(obj, dst_group, list(dst_ranks), async_op)

    def _dispatch(self, obj: Any, group: str, ranks: list[int], async_op: bool) -> CommWork | None:
        self._check_open()
        dsts = [(group, r) for r in ranks]
        if not dsts:
            return done_work() if async_op else None
        links = [self._links.get(d) for d in dsts]
        if any(link is None for link in links):
            if async_op:  # connecting may wait for the peer to start: do it off the caller's thread
                futs = [self._submit(d, self._send_lazy, obj, d) for d in dsts]
                return CommWork(futs, what=f"send to {group}{ranks}")
            links = [self._link(d) for d in dsts]
        messages = self._pack(obj, links)  # type: ignore[arg-type]
        if not async_op and not any(self._pending.get(d) for d in dsts):
            for link, msg in zip(links, messages):
                link.send(msg)  # type: ignore[union-attr]
            return None
        futs = [self._submit(d, link.send, msg) for d, link, msg in zip(dsts, links, messages)]  # type: ignore[union-attr]
        work = CommWork(futs, what=f"send to {group}{ranks}")
        if async_op:
            return work
        work.wait()
        return None

    def _send_lazy(self, obj: Any, dst: Peer) -> None:
        link = self._link(dst)
        link.send(self._pack(obj, [link])[0])

    def _pack(self, obj: Any, links: list[Transport]) -> list[Any]:
        """One message per link: the object itself for local links, else a ``Packed`` payload."""
        if all(link.kind == LinkKind.IN_PROCESS for link in links):
            return [obj] * len(links)
        enc = encode(obj)
        if enc.has_cuda() and self.record.cuda_uuids:
            return [obj if link.kind == LinkKind.IN_PROCESS else self._pack_gpu(obj, link) for link in links]
        shm = [i for i, link in enumerate(links) if link.kind == LinkKind.SHM]
        out: list[Any] = [None] * len(links)
        if shm:
            shared = pack(enc, self._pool, nslots=len(shm))
            for slot, i in enumerate(shm):
                out[i] = Packed(shared.desc.for_slot(slot), shared.inline, shared.segment)
        inline: Packed | None = None
        for i, link in enumerate(links):
            if link.kind == LinkKind.IN_PROCESS:
                out[i] = obj
            elif link.kind != LinkKind.SHM:
                inline = inline or pack(enc, None)
                out[i] = inline
        return out

    def _pack_gpu(self, obj: Any, link: Transport) -> Packed:
        """CUDA tensors by IPC or NCCL, decided per receiver (see ``cuda.py``)."""
        from m2flow.runtime.comm.cuda import GpuReducer

        reducer = GpuReducer(link.peer, same_node=link.kind == LinkKind.SHM)
        return pack(encode(obj, reducer), self._pool if link.kind == LinkKind.SHM else None)

    def _submit(self, dst: Peer, fn: Any, *args: Any) -> Future:
        with self._lock:
            ex = self._executors.get(dst)
            if ex is None:
                ex = self._executors[dst] = ThreadPoolExecutor(1, thread_name_prefix=f"m2flow-send-{dst[0]}{dst[1]}")
            self._pending[dst] = self._pending.get(dst, 0) + 1
        fut = ex.submit(fn, *args)

        def _done(_: Future) -> None:
            with self._lock:
                self._pending[dst] -= 1

        fut.add_done_callback(_done)
        return fut

    def _link(self, dst: Peer) -> Transport:
        link = self._links.get(dst)
        if link is not None:
            return link
        with self._lock:
            dst_lock = self._dst_locks.setdefault(dst, threading.Lock())
        with dst_lock:
            link = self._links.get(dst)
            if link is None:
                link = self._links[dst] = self._open(dst)
            return link

    def _open(self, dst: Peer) -> Transport:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            record = wait_record(self._rdv, dst[0], dst[1], max(0.0, deadline - time.monotonic()))
            try:
                return self._open_to(dst, record)
            except PeerDiedError:
                # A record left by a dead process (a restart in progress): wait for a fresh one.
                if time.monotonic() > deadline or pid_alive(record.pid) or record.hostname != HOSTNAME:
                    raise
                time.sleep(0.05)

    def _open_to(self, dst: Peer, record: PeerRecord) -> Transport:
        if record.process_uid == PROCESS_UID:
            with _LOCAL_LOCK:
                target = _LOCAL.get((self.namespace, dst[0], dst[1]))
            if target is not None and not target.closed:
                return LocalTransport((self.group, self.rank), target, record)
        same_node = record.node_id == self.record.node_id
        kind = LinkKind.SHM if same_node and self._policy == "auto" else LinkKind.TCP
        pool = self._pool if kind == LinkKind.SHM else None
        return SocketTransport((self.group, self.rank), PROCESS_UID, record, kind, pool, self.record.tcp_address[1][0])

    def transport_to(self, dst_group: str, dst_rank: int) -> LinkKind:
        """The transport kind used towards ``dst_group[dst_rank]`` (opens the connection)."""
        return self._link((dst_group, dst_rank)).kind

    def wait_shm_below(self, nbytes: int, timeout: float = 60.0) -> None:
        """Block until receivers have released segments down to ``nbytes`` still in use."""
        deadline = time.monotonic() + timeout
        delay = 1e-4
        while self._pool.busy_bytes() > nbytes:
            if time.monotonic() > deadline:
                raise CommError(f"receivers still hold {self._pool.busy_bytes()} shared bytes after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    # -- receiving ----------------------------------------------------------------------------
    def recv(self, src_group: str, src_rank: int, async_op: bool = False, timeout: float | None = None) -> Any:
        """The next object sent by ``src_group[src_rank]``; raises ``PeerDiedError`` if it died."""
        self._check_open()
        src = (src_group, src_rank)
        fut = self._inbox(src).claim()
        work = CommWork(fut, check=lambda: self._check_alive(src), what=f"recv from {src_group}[{src_rank}]")
        return work if async_op else work.wait(timeout)

    def pending(self, src_group: str, src_rank: int) -> int:
        """Messages from ``src_group[src_rank]`` arrived and not yet received: a probe that never blocks (a
        ``recv`` of the first of them returns at once)."""
        return self._inbox((src_group, src_rank)).pending

    def _inbox(self, src: Peer) -> Inbox:
        inbox = self._inboxes.get(src)
        if inbox is None:
            with self._lock:
                inbox = self._inboxes.setdefault(src, Inbox())
        return inbox

    def deliver(self, src: Peer, obj: Any) -> None:
        """Put a message from ``src`` into this rank's inbox (used by in-process senders)."""
        self._inbox(src).deliver(obj)

    def _check_alive(self, src: Peer) -> None:
        inbox = self._inbox(src)
        if inbox.connected:
            return  # a dropped connection is noticed by its reader
        record = lookup_record(self._rdv, *src)
        if record is not None and record.hostname == HOSTNAME and not pid_alive(record.pid):
            err = PeerDiedError(f"{record.label} died before its message arrived")
            inbox.fail(err)
            raise err

    def _on_accept(self, conn: Connection) -> None:
        with self._lock:
            self._accepted.append(conn)
        threading.Thread(target=self._serve, args=(conn,), daemon=True, name=f"m2flow-recv-{self.group}{self.rank}").start()

    def _serve(self, conn: Connection) -> None:
        try:
            (_, group, rank, uid), _, _ = conn.recv()
        except (ConnectionLost, ValueError):
            conn.close()
            return
        src = (group, rank)
        owner = f"{uid}:{group}:{rank}"
        inbox = self._inbox(src)
        inbox.revive()
        inbox.connected = True
        graceful = False
        nccl = None
        try:
            while True:
                control, inline, fds = conn.recv()
                if control[0] == "msg":
                    _, wire_desc, forget = control
                    if forget:
                        self._cache.forget(owner, forget)
                    desc = Desc.from_wire(wire_desc)
                    try:
                        gpu = nccl.recv(desc.gpu) if desc.gpu else None
                        inbox.deliver(unpack(desc, inline, fds, self._cache, gpu))
                    except Exception as exc:  # e.g. a class the receiver cannot import
                        inbox.deliver(None, error=CommError(f"cannot decode a message from {group}[{rank}]: {exc!r}"))
                elif control[0] == "nccl-init":
                    from m2flow.runtime.comm.cuda import NcclPair

                    nccl = NcclPair(control[1], control[2], rank=1)
                elif control[0] == "bye":
                    graceful = True
                    return
        except ConnectionLost:
            pass
        except Exception:
            log.exception("%s: reader for %s[%s] failed", self, group, rank)
        finally:
            inbox.connected = False
            conn.close()
            if not self.closed:
                record = lookup_record(self._rdv, group, rank)
                label = record.label if record is not None and record.process_uid == uid else f"{group}[{rank}]"
                if graceful:
                    inbox.fail(PeerClosedError(f"{label} closed its communicator"))
                else:
                    inbox.fail(PeerDiedError(f"{label} died: its connection dropped"))

    # -- lifecycle ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise CommError(f"{self} is closed")

    def close(self) -> None:
        """Say goodbye to every peer, stop listening and free this rank's shared memory."""
        if self.closed:
            return
        self.closed = True
        for ex in list(self._executors.values()):
            ex.shutdown(wait=True)
        for link in list(self._links.values()):
            link.close()
        self._listener.close()
        for conn in list(self._accepted):
            conn.close()
        with _LOCAL_LOCK:
            if _LOCAL.get((self.namespace, self.group, self.rank)) is self:
                del _LOCAL[(self.namespace, self.group, self.rank)]
        current = lookup_record(self._rdv, self.group, self.rank)
        if current is not None and current.process_uid == PROCESS_UID and current.unix_address == self.record.unix_address:
            self._rdv.remove(record_key(self.group, self.rank))
        self._pool.close()

