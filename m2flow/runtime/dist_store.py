"""torch's TCP key-value store, served on one address instead of every interface."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any


def tcp_store(host: str, port: int, world_size: int, serve: bool, timeout_s: float) -> Any:
    """A ``torch.distributed.TCPStore`` at ``host:port``; with ``serve`` this process hosts it there.

    torch's own server listens on every interface; here the server binds ``host`` itself and hands
    the socket over (``master_listen_fd``), so a one-machine run's store is on loopback only.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if not serve:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(max(128, world_size))
    except BaseException:
        sock.close()
        raise
    # The store takes the descriptor over (and closes it when it is destroyed).
    return dist.TCPStore(host, port, world_size, True, timeout=timeout, master_listen_fd=sock.detach())
