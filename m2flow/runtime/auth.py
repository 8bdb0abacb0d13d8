"""Who may open a connection to a listener of this run: a per-run secret, proven before any frame.

Every process of a run shares one secret, ``$M2FLOW_RUN_SECRET`` (64 hex digits). The process that
starts the run creates it (on first import of this module when the variable is unset) and every
process it launches inherits it: a locally started Ray through the environment of its raylet,
every rank and channel host through their constructor (``adopt``).

A connection is admitted only after a mutual HMAC-SHA256 challenge-response over raw bytes, so
nothing is unpickled before the peer has proven it holds the secret:

1. client -> server: ``MAGIC | client nonce``
2. server -> client: ``server nonce | HMAC(secret, "server" | client nonce | server nonce)``
3. client -> server: ``HMAC(secret, "client" | client nonce | server nonce)``

The two proofs carry different labels, so one side's answer is never valid as the other's. On a
Unix socket both ends also check the peer's uid (``SO_PEERCRED``): abstract sockets have no file
permissions, so another user's process could otherwise at least connect.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct

ENV_VAR = "M2FLOW_RUN_SECRET"
MAGIC = b"M2FLOW\x00\x01"
_NONCE = 32
_MAC = hashlib.sha256().digest_size
HANDSHAKE_TIMEOUT_S = 10.0
_UCRED = struct.Struct("3i")  # pid, uid, gid


class AuthError(ConnectionError):
    """The peer did not prove that it belongs to this run (or runs as another user)."""


def run_secret() -> bytes:
    """This run's secret; created (and exported to child processes) when none was inherited."""
    value = os.environ.get(ENV_VAR)
    if not value:
        value = secrets.token_hex(32)
        os.environ[ENV_VAR] = value
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        raise AuthError(f"${ENV_VAR} must be hex digits") from None
    if len(secret) < 16:
        raise AuthError(f"${ENV_VAR} must hold at least 16 bytes (32 hex digits)")
    return secret


def secret_hex() -> str:
    """The secret as handed to processes this one launches."""
    return run_secret().hex()


def adopt(secret: str | None) -> None:
    """Make ``secret`` (hex, from the launcher) this process's run secret; None keeps the current."""
    if secret:
        os.environ[ENV_VAR] = secret


def _proof(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, label + client_nonce + server_nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, never more: what follows the handshake belongs to the frame reader."""
    chunks = bytearray()
    while len(chunks) < n:
        data = sock.recv(n - len(chunks))
        if not data:
            raise AuthError("the peer closed the connection during the handshake")
        chunks += data
    return bytes(chunks)


def check_peer_uid(sock: socket.socket) -> None:
    """Refuse a Unix-socket peer that runs as another user (no-op for TCP)."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    if uid != os.getuid():
        raise AuthError(f"peer pid {pid} runs as uid {uid}, not {os.getuid()}")


def client_handshake(sock: socket.socket, secret: bytes | None = None, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Prove this side holds the run's secret and check that the server does too."""
    secret = run_secret() if secret is None else secret
    check_peer_uid(sock)
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        client_nonce = secrets.token_bytes(_NONCE)
        sock.sendall(MAGIC + client_nonce)
        reply = _recv_exact(sock, _NONCE + _MAC)
        server_nonce, server_mac = reply[:_NONCE], reply[_NONCE:]
        if not hmac.compare_digest(server_mac, _proof(secret, b"server", client_nonce, server_nonce)):
            raise AuthError("the listener does not hold this run's secret")
        sock.sendall(_proof(secret, b"client", client_nonce, server_nonce))
    except (TimeoutError, socket.timeout) as exc:
        raise AuthError(f"handshake timed out after {timeout:.0f}s") from exc
    finally:
        sock.settimeout(previous)


def server_handshake(sock: socket.socket, secret: bytes | None = None, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Admit the connecting peer only if it proves it holds the run's secret; raises ``AuthError``."""
    secret = run_secret() if secret is None else secret
    check_peer_uid(sock)
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        hello = _recv_exact(sock, len(MAGIC) + _NONCE)
        if hello[: len(MAGIC)] != MAGIC:
            raise AuthError("the peer does not speak the m2flow handshake")
        client_nonce = hello[len(MAGIC):]
        server_nonce = secrets.token_bytes(_NONCE)
        sock.sendall(server_nonce + _proof(secret, b"server", client_nonce, server_nonce))
        client_mac = _recv_exact(sock, _MAC)
        if not hmac.compare_digest(client_mac, _proof(secret, b"client", client_nonce, server_nonce)):
            raise AuthError("the peer does not hold this run's secret")
    except (TimeoutError, socket.timeout) as exc:
        raise AuthError(f"handshake timed out after {timeout:.0f}s") from exc
    finally:
        sock.settimeout(previous)


run_secret()  # a process that starts a run creates its secret before it launches anything
