"""The ``python`` tool: a snippet of Python run in a sandbox process, its printed output the result.

Each call runs in a fresh process of a ``SandboxPool`` of the tool's own (a process is retired after
one call, so nothing a snippet leaves behind reaches the next), under the pool's time limit and address
space limit (``RLIMIT_AS``). Before the snippet runs, the process moves into new user and network
namespaces (``unshare``), where there is no network interface up; where the kernel refuses that, the
``socket`` module's constructors are replaced by ones that raise. That fallback is a guard against
accidents, not a security boundary: run untrusted models' code on machines where ``unshare`` works.
The snippet's standard output (and ``repr`` of the value of a last bare expression, as in a notebook) is
the tool's output, cut at ``max_output_chars``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import logging
from typing import Any

from m2flow.rewards.sandbox import SandboxPool
from m2flow.rewards.tools.base import ToolTimeout

logger = logging.getLogger(__name__)

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


def _cut_network() -> str:
    """Leave the network in this process: new namespaces, else sockets that refuse; returns which."""
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


def run_snippet(code: str, max_output_chars: int) -> str:
    """Run ``code`` with the network cut; its stdout (plus the repr of a final bare expression), cut."""
    _cut_network()
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


class PythonTool:
    """``<tool>python: print(2**10)</tool>`` -> ``1024``; each call in a fresh sandbox process."""

    name = "python"
    description = "run a Python snippet (no network); its printed output is the result"
    isolated = True  # runs in a process of its own: the time limit is the pool's, which kills

    def __init__(self, timeout_s: float = 5.0, memory_limit_mb: int = 512, max_output_chars: int = 1000,
                 num_workers: int = 1) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.pool = SandboxPool(num_workers=num_workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb,
                                max_tasks_per_worker=1, preload=())

    def __call__(self, argument: str) -> str:
        return self.run([argument])[0]

    def run(self, snippets: list[str]) -> list[str]:
        """Outputs of several snippets run side by side on the pool; the first failure raises."""
        results, _ = self.pool.map(run_snippet, [(code, self.max_output_chars) for code in snippets])
        outputs = []
        for r in results:
            if r.status == "timeout":
                raise ToolTimeout(f"no result within {self.timeout_s:g}s")
            if r.status == "crash":
                raise RuntimeError(f"the snippet's process died ({r.error}; memory limit?)")
            if r.status == "error":
                raise RuntimeError(r.error)
            outputs.append(str(r.value))
        return outputs

    def close(self) -> None:
        """Stop the sandbox processes."""
        self.pool.close()
