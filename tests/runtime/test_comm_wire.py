"""Frames over sockets: bursts of frames with and without passed fds are read back exactly."""

from __future__ import annotations

import os
import socket

import numpy as np

from m2flow.runtime.comm.wire import BufferPool, Connection


def _memfd(text: bytes) -> int:
    fd = os.memfd_create("test")
    os.write(fd, text)
    return fd


def test_a_burst_of_frames_keeps_each_fd_with_its_frame():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tx, rx = Connection(a), Connection(b)
    plan = [(i, i % 3 == 1) for i in range(40)]  # every third frame carries an fd
    for i, with_fd in plan:
        fds = [_memfd(f"frame {i}".encode())] if with_fd else []
        tx.send(("n", i), [np.full(i, i, dtype=np.uint8)], fds)
        for fd in fds:
            os.close(fd)  # the receiver holds its own copy now
    for i, with_fd in plan:  # everything is buffered before the first read
        control, (buf,), fds = rx.recv()
        assert control == ("n", i) and buf.tolist() == [i] * i
        assert len(fds) == int(with_fd)
        for fd in fds:
            assert os.pread(fd, 64, 0) == f"frame {i}".encode()
            os.close(fd)
    tx.close()
    rx.close()


def test_large_bodies_land_in_pooled_blocks_that_come_back():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pool = BufferPool(min_bytes=1 << 10)
    tx, rx = Connection(a), Connection(b, pool)
    payload = np.arange(1 << 16, dtype=np.uint8)
    tx.send("big", [payload, payload[:10]])
    _, (first, second), _ = rx.recv()
    assert np.array_equal(first, payload) and np.array_equal(second, payload[:10])
    assert pool._free == []
    del first, second
    assert len(pool._free) == 1  # the block is back for the next frame
    tx.close()
    rx.close()


def test_frame_ready_tells_whether_a_whole_frame_is_buffered():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tx, rx = Connection(a), Connection(b)
    assert not rx.frame_ready()
    tx.send(("first",))
    tx.send(("second",), [np.arange(5, dtype=np.uint8)])
    assert rx.recv()[0] == ("first",)  # one read brings both frames in
    assert rx.frame_ready()
    control, (buf,), fds = rx.recv()
    assert control == ("second",) and buf.tolist() == [0, 1, 2, 3, 4] and fds == []
    assert not rx.frame_ready()
    tx.send(("third",), [], [_memfd(b"x")])  # a frame with an fd comes whole as well
    control, _, fds = rx.recv()
    assert control == ("third",) and len(fds) == 1
    os.close(fds[0])
    a.sendall(b"\x00" * 4)  # the start of a prefix is not a frame
    rx._fill(4)
    assert not rx.frame_ready()
    tx.close()
    rx.close()
