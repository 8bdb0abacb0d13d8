"""What runs inside the python tool's sandbox: one snippet, its printed output the result.

Kept to the standard library, so the sandbox host that imports it to run snippets stays small (a
small process forks fast, and a fork per snippet is the tool's per-call cost).
"""

from __future__ import annotations

import ast
import contextlib
import io
from typing import Any

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


def cut_network() -> str:
    """Leave the network in this process: new namespaces, else sockets that refuse; returns which.

    Only for unconfined runs (``allow_unsandboxed``): a confined process has no network to leave.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
            return "namespace"
    except (OSError, AttributeError):
        pass
    import socket

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("network access is disabled in the python tool")

    socket.socket = refuse  # type: ignore[assignment, misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.socketpair = refuse  # type: ignore[assignment]
    return "socket"


def run_snippet(code: str, max_output_chars: int, unconfined: bool = False) -> str:
    """Run ``code``; its stdout (plus the repr of a final bare expression), cut at ``max_output_chars``."""
    if unconfined:
        cut_network()
    tree = ast.parse(code, mode="exec")
    tail = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        tail = ast.Expression(tree.body.pop().value)
    scope: dict[str, Any] = {"__name__": "__snippet__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, "<snippet>", "exec"), scope)  # noqa: S102 - the point of the tool, in its sandbox
        if tail is not None:
            value = eval(compile(tail, "<snippet>", "eval"), scope)  # noqa: S307 - same sandbox
            if value is not None:  # a REPL's echo of the last expression, into the captured output
                out.write(repr(value) + "\n")
    text = out.getvalue().rstrip("\n")
    if len(text) > max_output_chars:
        text = text[:max_output_chars] + "...(cut)"
    return text
