"""Per-pair transports behind one interface; a communicator picks one per destination.

| kind    | when                                  | small objects      | tensor bytes                        |
|---------|---------------------------------------|--------------------|-------------------------------------|
| local   | both ends in one process              | the object itself  | the object itself (no copy)         |
| shm     | same node                             | Unix socket frame  | memfd segment: 1 copy, receiver maps|
| tcp     | different nodes                       | TCP frame          | inline in the TCP stream            |
| cuda    | CUDA tensors, see ``cuda.py``         | socket frame       | CUDA IPC (same GPU) / NCCL          |
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any, Protocol

from m2flow.runtime.comm.errors import PeerDiedError
from m2flow.runtime.comm.payload import Packed
from m2flow.runtime.comm.rendezvous import PeerRecord
from m2flow.runtime.comm.shm import SegmentPool
from m2flow.runtime.comm.wire import Connection, ConnectionLost, connect

log = logging.getLogger(__name__)


class Transport(Protocol):
    """The sending side of one ordered pair of ranks."""

    kind: str
    peer: PeerRecord

    def send(self, message: Any) -> None:
        """Deliver one message; in process it is the object, otherwise a ``Packed`` payload."""
        ...

    def close(self) -> None: ...


class LinkKind(StrEnum):
    """How a message reaches its peer: as the object itself, through shared memory, or over a socket."""

    IN_PROCESS = "inprocess"
    SHM = "shm"
    TCP = "tcp"


class Inboxes(Protocol):
    """The receiving end of an in-process link (a ``Communicator``)."""

    closed: bool

    def deliver(self, src: tuple[str, int], obj: Any) -> None: ...


class LocalTransport:
    """Both ends live in this process: the receiver gets the very object that was sent."""

    kind = LinkKind.IN_PROCESS

    def __init__(self, src: tuple[str, int], target: Inboxes, peer: PeerRecord) -> None:
        self._src = src
        self._target = target
        self.peer = peer

    def send(self, message: Any) -> None:
        if self._target.closed:
            raise PeerDiedError(f"{self.peer.label} has closed its communicator")
        self._target.deliver(self._src, message)

    def close(self) -> None:
        pass


class SocketTransport:
    """A direct connection (Unix socket on one node, TCP across nodes) opened on first use."""

    def __init__(
        self, src: tuple[str, int], src_uid: str, peer: PeerRecord, kind: LinkKind, pool: SegmentPool | None, local_ip: str = "127.0.0.1"
    ) -> None:
        self.kind = kind
        self._local_ip = local_ip
        self._nccl: Any = None
        self.peer = peer
        self.pool = pool  # only same-node transports place bytes in shared memory
        self.key = f"{peer.process_uid}:{peer.group}:{peer.rank}"
        address = peer.unix_address if kind == LinkKind.SHM else peer.tcp_address
        try:
            self.conn: Connection = connect(address)
            self.conn.send(("hello", src[0], src[1], src_uid))
        except (OSError, ConnectionLost) as exc:
            raise PeerDiedError(f"cannot connect to {peer.label} over {kind}: {exc}") from exc

    def send(self, message: Packed) -> None:
        seg = message.segment
        if seg is not None:
            seg.peers.add(self.key)
        if message.gpu_tensors and self._nccl is None:
            self._open_nccl()
        forget = self.pool.take_forgets(self.key) if self.pool is not None else []
        try:
            self.conn.send(("msg", message.desc.to_wire(), forget), message.inline, message.fds)
        except ConnectionLost as exc:
            if seg is not None:
                seg.flags[message.desc.slot] = 0  # nobody will map it now
            raise PeerDiedError(f"lost the connection to {self.peer.label}: {exc}") from exc
        if message.gpu_tensors:
            self._nccl.send(message.gpu_tensors)  # type: ignore[union-attr]

    def _open_nccl(self) -> None:
        from m2flow.runtime.comm.cuda import NcclPair, free_port

        host = self._local_ip if self.kind == LinkKind.TCP else "127.0.0.1"
        port = free_port(host)
        self.conn.send(("nccl-init", host, port))  # the receiver joins while we wait below
        self._nccl = NcclPair(host, port, rank=0)

    def send_control(self, control: Any) -> None:
        self.conn.send(control)

    def close(self) -> None:
        try:
            self.conn.send(("bye",))
        except (ConnectionLost, OSError):
            pass
        self.conn.close()
