"""The ``python`` tool: a snippet of Python run in a sandbox, its printed output the result.

Every call runs in a fresh process forked inside a sandbox (``rewards/confine.py``) by a long-lived
host of the tool's ``SandboxPool``, so the sandbox is set up once per host and each snippet still
starts from the same clean state. The snippet sees the file system read-only (code only: no home,
no run directory, no secret of the run), writes only to a private ``/tmp`` of ``scratch_mb`` (emptied
after each call), sees and signals only its own processes (at most ``max_processes``), has no network,
and runs under limits of time, memory (``RLIMIT_AS``), CPU time, file size and open files.
``subprocess`` works inside and is confined the same way.

The sandbox fails closed: where neither bubblewrap nor unprivileged user namespaces work, the tool
refuses to start unless ``allow_unsandboxed=True`` accepts the risk; then snippets run as before this
sandbox existed, in plain processes with the network cut (``snippet.cut_network``), which guards
against accidents only. The snippet's standard output (and ``repr`` of the value of a last bare
expression, as in a notebook) is the tool's output, cut at ``max_output_chars``.
"""

from __future__ import annotations

import logging

from m2flow.rewards.confine import ISOLATIONS, Isolation, SandboxUnavailable, resolve, why_unavailable
from m2flow.rewards.sandbox import SandboxPool
from m2flow.rewards.tools.base import ToolTimeout
from m2flow.rewards.tools.snippet import cut_network, run_snippet

__all__ = ["PythonTool", "cut_network", "run_snippet", "sandbox_backend"]

logger = logging.getLogger(__name__)


def sandbox_backend(isolation: Isolation, allow_unsandboxed: bool) -> str | None:
    """The backend the tool runs under, or None (unconfined) only when ``allow_unsandboxed``; else raises
    ``SandboxUnavailable`` in one line that names the setting accepting the risk."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"python tool: isolation must be one of {', '.join(ISOLATIONS)}; got {isolation!r}")
    if not isinstance(allow_unsandboxed, bool):
        raise ValueError(f"python tool: allow_unsandboxed must be true or false; got {allow_unsandboxed!r}")
    backend = resolve(isolation)  # a named backend that does not work raises here
    if backend is not None:
        return backend
    if allow_unsandboxed:
        logger.warning("python tool: model code runs UNSANDBOXED (allow_unsandboxed: true)")
        return None
    why = "isolation: none" if isolation == "none" else why_unavailable()
    raise SandboxUnavailable(f"python tool: no sandbox for model code ({why}); install bubblewrap or allow user "
                             f"namespaces, or set allow_unsandboxed: true in the tool's settings to accept the risk")


class PythonTool:
    """``<tool>python: print(2**10)</tool>`` -> ``1024``; each call in a fresh sandboxed process."""

    name = "python"
    description = "run a Python snippet (no network); its printed output is the result"
    parameters = {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "description": "Python source; print what you want to see"}}}
    isolated = True  # runs in a process of its own: the time limit is the pool's, which kills

    def __init__(self, timeout_s: float = 5.0, memory_limit_mb: int = 512, max_output_chars: int = 1000,
                 num_workers: int = 1, isolation: Isolation = "auto", allow_unsandboxed: bool = False,
                 scratch_mb: int = 16, max_processes: int = 16) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.backend = sandbox_backend(isolation, allow_unsandboxed)
        if self.backend is None:  # a fresh forkserver process per call, as before the sandbox
            self.pool = SandboxPool(num_workers=num_workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb,
                                    max_tasks_per_worker=1, preload=("m2flow.rewards.sandbox",),
                                    isolation="none")
        else:
            self.pool = SandboxPool(num_workers=num_workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb,
                                    max_tasks_per_worker=None, preload=("m2flow.rewards.tools.snippet",),
                                    isolation=self.backend, fresh_process_per_task=True, scratch_mb=scratch_mb,
                                    max_processes=max_processes)

    def __call__(self, argument: str) -> str:
        return self.run([argument])[0]

    def run(self, snippets: list[str]) -> list[str]:
        """Outputs of several snippets run side by side on the pool; the first failure raises."""
        unconfined = self.backend is None
        results, _ = self.pool.map(run_snippet, [(code, self.max_output_chars, unconfined) for code in snippets])
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
