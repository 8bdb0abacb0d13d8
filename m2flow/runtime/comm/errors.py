"""Errors raised by point-to-point communication; each names the peer it concerns."""

from __future__ import annotations


class CommError(RuntimeError):
    """A message could not be sent or received."""


class PeerDiedError(CommError):
    """The other end's process went away (no goodbye on the connection, or its pid is gone)."""


class PeerClosedError(CommError):
    """The other end closed its communicator cleanly; nothing more will arrive from it."""


class CommTimeout(CommError, TimeoutError):
    """A send or receive did not complete within its time limit."""
