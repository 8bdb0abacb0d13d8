"""Length-prefixed frames over stream sockets, with file descriptors riding along on Unix sockets.

A frame is ``prefix | head | body``: the prefix gives the head length, the number of passed fds
and the body length; the head is a pickled ``(control, inline_sizes)``; the body is the inline
buffers back to back, read straight into freshly allocated arrays (no intermediate bytes).

No frame is read before the peer has passed the run's handshake (``auth.py``): ``connect`` and
``Listener`` run it on the raw socket, so whatever ``recv`` unpickles comes from a process of
this run.
"""

from __future__ import annotations

import array
import logging
import os
import pickle
import socket
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from m2flow.runtime.auth import AuthError, client_handshake, server_handshake

log = logging.getLogger(__name__)

_PREFIX = struct.Struct("<IIQ")  # head_len, nfds, body_len
_MAX_FDS = 64
_SMALL = 256 << 10  # frames below this are joined and sent in one system call
_SOCK_BUF = 4 << 20
_READ_AHEAD = 256 << 10
_FD_MARKER = b"\x00"


def close_fds(fds: list[int]) -> None:
    """Close received (or no longer needed) file descriptors; one already closed is skipped."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _fds_from(anc: list) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return fds


class BufferPool:
    """Reusable receive buffers for large frames, so a stream of big messages stops page-faulting.

    A frame's inline buffers are views of one pooled block; the block comes back to the pool when
    the receiver has dropped every array and tensor viewing it (the same finalizer trick as the
    shared-memory segments). Idle blocks beyond ``max_idle_bytes`` are freed.
    """

    def __init__(self, min_bytes: int = 1 << 20, max_idle_bytes: int = 1 << 30) -> None:
        self.min_bytes = min_bytes
        self.max_idle_bytes = max_idle_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        """A uint8 array of ``n`` bytes over a pooled block, shape (n,)."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if n <= b.nbytes <= 2 * n]
            best = min(fits, key=lambda i: self._free[i].nbytes) if fits else None
            block = self._free.pop(best) if best is not None else None
        if block is None:
            block = np.empty((n + (1 << 20) - 1) >> 20 << 20, dtype=np.uint8)
        # A fresh exporter per message: every slice's ``base`` is this array, so it dies last.
        view = np.frombuffer(block.data, dtype=np.uint8, count=n)
        weakref.finalize(view, self._give_back, block)
        return view

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            self._free.append(block)
            while sum(b.nbytes for b in self._free) > self.max_idle_bytes:
                self._free.pop(0)


class ConnectionLost(ConnectionError):
    """The peer closed the socket or the connection broke."""


def tune(sock: socket.socket) -> None:
    """Large kernel buffers for throughput, no Nagle delay for latency."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)
        except OSError:
            pass
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Connection:
    """One stream socket carrying frames; sends are serialized by a lock, receives by the caller."""

    def __init__(self, sock: socket.socket, pool: BufferPool | None = None) -> None:
        self.sock = sock
        self.pool = pool
        self.unix = sock.family == socket.AF_UNIX
        self._send_lock = threading.Lock()
        self.closed = False
        self._rbuf = bytearray()
        self._rpos = 0  # consumed bytes at the front of ``_rbuf``
        self._rbase = 0  # stream offset of ``_rbuf[0]``
        self._fd_marks: dict[int, list[int]] = {}

    def send(self, control: Any, buffers: Sequence[Any] = (), fds: Sequence[int] = ()) -> None:
        """Send one frame; ``buffers`` are bytes-like, ``fds`` need a Unix socket."""
        if not buffers and not fds:  # a control message alone: the common small frame
            head = pickle.dumps((control, ()), protocol=5)
            try:
                with self._send_lock:
                    self.sock.sendall(_PREFIX.pack(len(head), 0, 0) + head)
            except OSError as exc:
                self.closed = True
                raise ConnectionLost(str(exc)) from exc
            return
        views = [memoryview(b).cast("B") for b in buffers]
        head = pickle.dumps((control, [v.nbytes for v in views]), protocol=5)
        body_len = sum(v.nbytes for v in views)
        prefix = _PREFIX.pack(len(head), len(fds), body_len)
        if fds and not self.unix:
            raise ValueError("file descriptors travel only over Unix sockets")
        if len(fds) > _MAX_FDS:
            raise ValueError(f"at most {_MAX_FDS} fds per frame, got {len(fds)}")
        try:
            with self._send_lock:
                if body_len + len(head) < _SMALL:
                    self._send_first(b"".join([prefix, head, *views]), fds)
                else:
                    self._send_first(prefix + head, fds)
                    for v in views:
                        self.sock.sendall(v)
        except OSError as exc:
            self.closed = True
            raise ConnectionLost(str(exc)) from exc

    def _send_first(self, data: bytes, fds: Sequence[int]) -> None:
        if fds:
            # fds ride alone on a one-byte marker just before the frame: Linux hands them out
            # with the last byte a read returns, so the receiver can tell exactly where they go.
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            self.sock.sendmsg([_FD_MARKER], anc)
        self.sock.sendall(data)

    # -- receiving: one read-ahead buffer, so a burst of small frames costs one system call ------
    def _fill(self, need: int) -> None:
        """Read until ``need`` unconsumed bytes are buffered, noting where passed fds arrived."""
        while len(self._rbuf) - self._rpos < need:
            want = max(need - (len(self._rbuf) - self._rpos), _READ_AHEAD)
            at = self._rbase + len(self._rbuf)  # stream offset of the first byte read now
            if self.unix:
                # A read stops right after data that carries fds, so they belong to its last byte:
                # the sender's marker before the frame that owns them.
                data, anc, _, _ = self.sock.recvmsg(want, socket.CMSG_SPACE(_MAX_FDS * 4))
                fds = _fds_from(anc)
                if fds:
                    self._fd_marks[at + len(data) - 1] = fds
            else:
                data = self.sock.recv(want)
            if not data:
                raise ConnectionLost("peer closed the connection")
            self._rbuf += data

    def _take(self, n: int) -> memoryview:
        self._fill(n)
        view = memoryview(self._rbuf)[self._rpos : self._rpos + n]
        self._rpos += n
        return view

    def _take_into(self, dst: memoryview) -> None:
        """Fill ``dst`` from the buffer, then straight from the socket for large bodies."""
        n = dst.nbytes
        have = min(n, len(self._rbuf) - self._rpos)
        if have:
            dst[:have] = memoryview(self._rbuf)[self._rpos : self._rpos + have]
            self._rpos += have
        if have < n and n - have < _READ_AHEAD:
            dst[have:] = self._take(n - have)
            return
        pos = have
        while pos < n:  # body bytes never carry fds: fds ride on a frame's first bytes
            got = self.sock.recv_into(dst[pos:])
            if got == 0:
                raise ConnectionLost("peer closed the connection")
            pos += got
            self._rbase += got  # these bytes bypassed the buffer

    def _compact(self) -> None:
        if self._rpos:
            del self._rbuf[: self._rpos]
            self._rbase += self._rpos
            self._rpos = 0

    def frame_ready(self) -> bool:
        """True when a whole frame is already buffered, so ``recv`` will not block.

        A server uses it to handle a burst of frames before writing its replies in one go.
        """
        pos = self._rpos
        avail = len(self._rbuf) - pos
        if self.unix and avail and (self._rbase + pos) in self._fd_marks:
            pos, avail = pos + 1, avail - 1  # the fd marker byte
        if avail < _PREFIX.size:
            return False
        head_len, _, body_len = _PREFIX.unpack_from(self._rbuf, pos)
        return avail >= _PREFIX.size + head_len + body_len

    def _buffered_control(self) -> tuple[Any, list[np.ndarray], list[int]] | None:
        """The next frame when it is already buffered and carries neither body nor fds, else None."""
        pos = self._rpos
        avail = len(self._rbuf) - pos
        if avail < _PREFIX.size or (self.unix and (self._rbase + pos) in self._fd_marks):
            return None
        head_len, nfds, body_len = _PREFIX.unpack_from(self._rbuf, pos)
        if nfds or body_len or avail < _PREFIX.size + head_len:
            return None
        start = pos + _PREFIX.size
        control, sizes = pickle.loads(self._rbuf[start : start + head_len])
        self._rpos = start + head_len
        return control, [np.empty(0, dtype=np.uint8) for _ in sizes], []

    def recv(self) -> tuple[Any, list[np.ndarray], list[int]]:
        """Block for the next frame: ``(control, inline buffers as uint8 arrays, received fds)``."""
        try:
            if self._rpos > _READ_AHEAD:
                self._compact()
            small = self._buffered_control()
            if small is not None:
                return small
            fds: list[int] = []
            if self.unix:
                self._fill(1)
                fds = self._fd_marks.pop(self._rbase + self._rpos, [])
                if fds:
                    self._rpos += 1  # the marker byte
            head_len, nfds, _ = _PREFIX.unpack(self._take(_PREFIX.size))
            control, sizes = pickle.loads(self._take(head_len))
            total = sum(sizes)
            if self.pool is not None and total >= self.pool.min_bytes:
                block = self.pool.take(total)
                self._take_into(memoryview(block))
                offsets = np.cumsum([0, *sizes])
                buffers = [block[offsets[i] : offsets[i + 1]] for i in range(len(sizes))]
            else:
                buffers = []
                for n in sizes:
                    arr = np.empty(n, dtype=np.uint8)
                    if n:
                        self._take_into(memoryview(arr))
                    buffers.append(arr)
        except OSError as exc:
            self.closed = True
            raise ConnectionLost(str(exc)) from exc
        if len(fds) != nfds:
            raise ConnectionLost(f"expected {nfds} file descriptors with the frame, got {len(fds)}")
        return control, buffers, fds

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect(
    address: tuple[str, Any], timeout: float = 10.0, pool: BufferPool | None = None, secret: bytes | None = None
) -> Connection:
    """Open an authenticated connection to ``("unix", name)`` or ``("tcp", (host, port))``.

    ``secret`` defaults to the run's (``auth.run_secret``); a listener that cannot prove it holds
    the same raises ``AuthError`` (a ``ConnectionError``, so an ``OSError``).
    """
    family, where = address
    if family == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(where)
        client_handshake(sock, secret, timeout)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    tune(sock)
    return Connection(sock, pool)


class Listener:
    """Accepts connections on an abstract Unix socket and a TCP port; hands each to ``on_accept``.

    Each accepted socket passes the run's handshake on a thread of its own first (a peer that
    stalls cannot hold up others); one that fails is closed before a byte of it is unpickled.
    """

    def __init__(
        self, host: str, on_accept: Any, name: str, pool: BufferPool | None = None, secret: bytes | None = None
    ) -> None:
        self._pool = pool
        self._secret = secret
        self.refused = 0  # connections that failed the handshake
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(f"\0m2flow-{name}")  # abstract namespace: no file to clean up
        self.unix.listen(128)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind((host, 0))
        self.tcp.listen(128)
        self.unix_address = ("unix", f"\0m2flow-{name}")
        self.tcp_address = ("tcp", self.tcp.getsockname()[:2])
        self._on_accept = on_accept
        self._stop = False
        self._threads = [
            threading.Thread(target=self._loop, args=(s,), daemon=True, name=f"m2flow-accept-{name}")
            for s in (self.unix, self.tcp)
        ]
        for t in self._threads:
            t.start()

    def _loop(self, server: socket.socket) -> None:
        while not self._stop:
            try:
                sock, _ = server.accept()
            except OSError:
                return  # closed
            if self._stop:
                sock.close()
                return
            threading.Thread(target=self._admit, args=(sock,), daemon=True, name="m2flow-admit").start()

    def _admit(self, sock: socket.socket) -> None:
        try:
            server_handshake(sock, self._secret)
        except (AuthError, OSError) as exc:
            self.refused += 1
            log.warning("refused a connection that did not pass the run's handshake: %s", exc)
            sock.close()
            return
        if self._stop:
            sock.close()
            return
        tune(sock)
        self._on_accept(Connection(sock, self._pool))

    def close(self) -> None:
        self._stop = True
        for s in (self.unix, self.tcp):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
