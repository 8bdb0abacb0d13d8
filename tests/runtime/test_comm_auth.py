"""Only processes holding the run's secret get a frame read: a crafted pickle never runs."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time

import numpy as np
import pytest

from m2flow.runtime.channel import Channel
from m2flow.runtime.comm import Communicator, MemoryRendezvous
from m2flow.runtime.auth import MAGIC, AuthError, run_secret
from m2flow.runtime.comm.wire import Listener, connect


class _MakesFile:
    """Unpickling this object creates ``path``: proof that a frame's payload was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted_frame(path: str) -> bytes:
    head = pickle.dumps((_MakesFile(path), ()), protocol=5)
    return struct.pack("<IIQ", len(head), 0, 0) + head


def _raw(address: tuple) -> socket.socket:
    family, where = address
    sock = socket.socket(socket.AF_UNIX if family == "unix" else socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(where)
    return sock


def _send_crafted(address: tuple, path: str, with_magic: bool) -> None:
    sock = _raw(address)
    try:
        # Without the secret an attacker can only guess the proof; with the magic first it gets
        # as far as the server's challenge.
        sock.sendall((MAGIC + os.urandom(32) if with_magic else b"") + _crafted_frame(path) * 4)
        try:
            sock.recv(1 << 16)
            sock.recv(1 << 16)  # the server hangs up on the wrong proof
        except OSError:
            pass
    finally:
        sock.close()


def _wait_refused(listener: Listener, n: int) -> None:
    deadline = time.monotonic() + 10
    while listener.refused < n and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_listener_never_unpickles_a_frame_from_a_peer_without_the_secret(tmp_path, kind):
    got = []
    listener = Listener("127.0.0.1", lambda conn: got.append(conn.recv()), name=f"test-auth-{os.getpid()}-{kind}")
    address = listener.unix_address if kind == "unix" else listener.tcp_address
    try:
        marker = tmp_path / "ran"
        _send_crafted(address, str(marker), with_magic=False)
        _send_crafted(address, str(marker), with_magic=True)
        _wait_refused(listener, 2)
        assert listener.refused == 2
        assert not marker.exists() and got == []
        # A process of the run still gets through, and its frames arrive.
        conn = connect(address)
        conn.send(("hello", 1), [np.arange(3, dtype=np.uint8)])
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got and got[0][0] == ("hello", 1) and got[0][1][0].tolist() == [0, 1, 2]
        conn.close()
    finally:
        listener.close()


def test_a_client_refuses_a_listener_with_another_secret():
    other = os.urandom(32)
    listener = Listener("127.0.0.1", lambda conn: None, name=f"test-auth-{os.getpid()}-other", secret=other)
    try:
        with pytest.raises(AuthError, match="listener does not hold"):
            connect(listener.unix_address)
        assert connect(listener.unix_address, secret=other) is not None
    finally:
        listener.close()


def test_a_stalled_peer_does_not_hold_up_the_others():
    seen = threading.Event()
    listener = Listener("127.0.0.1", lambda conn: seen.set(), name=f"test-auth-{os.getpid()}-stall")
    stalled = _raw(listener.unix_address)  # connects and says nothing
    try:
        connect(listener.unix_address, secret=run_secret())
        assert seen.wait(5)
    finally:
        stalled.close()
        listener.close()


def test_a_communicator_and_a_channel_host_refuse_crafted_frames(tmp_path):
    comm = Communicator("auth-recv", 0, rendezvous=MemoryRendezvous("test-auth"))
    channel = Channel.create(f"auth-{os.getpid()}", local=True, rendezvous=MemoryRendezvous("test-auth"))
    marker = tmp_path / "ran"
    try:
        for address in (comm.record.unix_address, comm.record.tcp_address,
                        channel.address.unix_address, channel.address.tcp_address):
            _send_crafted(address, str(marker), with_magic=True)
        _wait_refused(comm._listener, 2)
        time.sleep(0.2)
        assert not marker.exists()
        channel.put({"still": "works"})
        assert channel.get(timeout=10) == {"still": "works"}
    finally:
        channel.destroy()
        comm.close()
