"""A confined host process for one ``SandboxPool`` worker, and the pool's handle on it.

The host is started fresh (``python -I``, an environment of its own, no memory of the trainer's) inside
the sandbox of ``confine.py``, imports the pool's modules once, then serves tasks from the pool:

- ``fresh=False`` (reward checks): tasks run one after another in a long-lived worker process forked
  from the host, as in an unconfined pool's worker; the host keeps each task's time limit, and
  replaces the worker (a fork: milliseconds, where a new host would re-import sympy) after a
  timeout, a crash or ``max_tasks`` tasks.
- ``fresh=True`` (the python tool): each task runs in a child forked from the host, under rlimits
  (memory, CPU time, file size, open files, processes), with a time limit and a process count kept
  by the host. After each task the host kills every other process of its PID namespace (it is PID 1
  there) and empties ``/tmp``, so nothing of one task reaches the next; the host survives timeouts
  and crashes, which come back as replies.

Nothing the host sends is trusted: replies are plain data (numbers, text, lists, dicts) decoded by an
unpickler that refuses every class (``loads_plain``), so code run in the sandbox cannot make the
trainer run code by forging a reply.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from m2flow.rewards.confine import SANDBOX_ENV, Backend, View, bwrap_argv, default_view, enter_namespaces, inside

READY = "ready"
MAX_REPLY_BYTES = 4 << 20
"""A reply larger than this is refused (a crash of the host): a bound on what sandboxed code can send."""
POLL_S = 0.02
"""How often the host counts a running task's processes."""
_BOOT = ("import json, sys; c = json.loads(sys.argv[1]); sys.path[:] = c['sys_path']; "
         "from m2flow.rewards.sandbox_host import main; main(c)")


def import_module(name: str) -> None:
    """Import ``name`` in a worker (the warm-up of a new check's module, outside any check's time limit)."""
    import importlib

    importlib.import_module(name)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a sandbox reply may hold plain data only, not {module}.{name}")


def loads_plain(data: bytes) -> Any:
    """Unpickle ``data`` that may come from sandboxed code: builtin values only, no class is ever looked up."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as builtin data (numpy/torch numbers via ``item``/``tolist``); anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if depth > 20:
        return repr(value)[:200]
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    for method in ("tolist", "item"):
        if hasattr(value, method):
            try:
                return plain(getattr(value, method)(), depth + 1)
            except Exception:  # noqa: BLE001 - fall back to the repr
                break
    return repr(value)[:200]


# --- inside the sandbox ------------------------------------------------------------------------

def _look_inside(sys_path: list[str]) -> None:
    """Import from where the sandbox shows the code (``confine.inside``), this process being confined now:
    ``sys.path`` and the search paths of the packages imported before (``m2flow`` itself among them)."""
    sys.path[:] = sys_path
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [inside(p) for p in search]
    sys.path_importer_cache.clear()


def main(config: dict[str, Any]) -> None:
    """The host: confine (namespaces backend), import, say ready, serve tasks until told to stop."""
    conn = Connection(config["fd"])
    try:
        if config["backend"] == "namespaces":
            enter_namespaces(View(tuple(config["visible"]), tuple(map(tuple, config["links"])), config["scratch_mb"]))
            _look_inside(config["sys_path_inside"])
        else:
            import ctypes

            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the tasks cannot trace the host
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores default-handled signals from inside
        for name in config["imports"]:
            try:
                import_module(name)
            except Exception:  # noqa: BLE001 - the check itself will fail, and be counted, when it is called
                pass
    except BaseException as exc:  # noqa: BLE001 - told to the pool, which refuses to start
        conn.send_bytes(pickle.dumps(("failed", f"{type(exc).__name__}: {exc}"[:500])))
        return
    worker = None if config["fresh"] else _TaskWorker(conn.fileno(), config)
    conn.send_bytes(pickle.dumps(READY))
    while True:
        try:
            message = conn.recv()  # from the pool: trusted
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, fn, args, limit = message
        if fn is import_module:  # into the host, so that every process it forks from now on has it
            status, payload = _run_here(fn, args)
            if worker is not None:
                worker.replace()
        elif worker is not None:
            status, payload = worker.run(fn, args, limit)
        else:
            status, payload = _run_forked(conn.fileno(), fn, args, limit, config)
        try:
            conn.send_bytes(pickle.dumps((task_id, status, payload)))
        except Exception as exc:  # noqa: BLE001 - e.g. a value too deep to pickle
            conn.send_bytes(pickle.dumps((task_id, "error", f"cannot send result: {type(exc).__name__}")))
        if config["fresh"] and not _wipe_scratch():
            os._exit(3)  # a scratch dir that cannot be emptied: a fresh host gets a fresh one


def _run_here(fn: Any, args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "ok", plain(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, none kills the loop
        return "error", f"{type(exc).__name__}: {exc}"[:500]


class _TaskWorker:
    """The host's long-lived worker process (reward checks): tasks run in it one after another."""

    def __init__(self, conn_fd: int, config: dict[str, Any]) -> None:
        self.conn_fd, self.config = conn_fd, config
        self.pid, self.conn = self._start()
        self.tasks = 0

    def _start(self) -> tuple[int, Connection]:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                os.close(self.conn_fd)
                if self.config["memory_limit_mb"]:
                    import resource

                    limit = self.config["memory_limit_mb"] << 20
                    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
                conn = Connection(theirs.detach())
                while True:
                    fn, args = conn.recv()
                    conn.send_bytes(pickle.dumps(_run_here(fn, args)))
            finally:
                os._exit(0)
        theirs.close()
        return pid, Connection(ours.detach())

    def replace(self) -> int | None:
        """A fresh worker in place of this one (which is killed, with anything it started); its exit code."""
        self.conn.close()
        code = _kill_all(self.pid)
        self.pid, self.conn = self._start()
        self.tasks = 0
        return code

    def run(self, fn: Any, args: tuple[Any, ...], limit_s: float) -> tuple[str, Any]:
        """One task under ``limit_s``: the reply, or ``timeout``/``crash`` (the worker then replaced)."""
        try:
            self.conn.send((fn, args))
            if not self.conn.poll(limit_s):
                self.replace()
                return "timeout", "no answer within the time limit"
            outcome = tuple(loads_plain(self.conn.recv_bytes(MAX_REPLY_BYTES)))
        except (EOFError, OSError, pickle.UnpicklingError):
            return "crash", f"the worker process died (exit code {self.replace()}; memory limit?)"
        self.tasks += 1
        if self.config["max_tasks"] and self.tasks >= self.config["max_tasks"]:
            self.replace()  # bounds the growth of sympy's and the parser's caches in long runs
        return outcome  # type: ignore[return-value]


def _limit_child(limit_s: float, config: dict[str, Any]) -> None:
    import resource

    def cap(which: int, value: int) -> None:
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))

    if config["memory_limit_mb"]:
        cap(resource.RLIMIT_AS, config["memory_limit_mb"] << 20)
    cap(resource.RLIMIT_CPU, math.ceil(limit_s) + 1)
    cap(resource.RLIMIT_FSIZE, config["scratch_mb"] << 20)
    cap(resource.RLIMIT_NOFILE, 256)
    cap(resource.RLIMIT_CORE, 0)
    # Counted per uid of the sandbox's user namespace (the host and its outer process are two of them);
    # the kernel does not apply it to root's processes, hence also the host's own count.
    cap(resource.RLIMIT_NPROC, config["max_processes"] + 2)


def _process_count() -> int:
    """Processes of this PID namespace besides the host."""
    return sum(1 for name in os.listdir("/proc") if name.isdigit()) - 1


def _run_forked(conn_fd: int, fn: Any, args: tuple[Any, ...], limit_s: float, config: dict[str, Any]) -> tuple[str, Any]:
    """Run one task in a fresh child under the limits; the reply, or ``timeout``/``crash``/``error``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task's process
        try:
            os.close(r)
            os.close(conn_fd)
            _limit_child(limit_s, config)
            data = pickle.dumps(_run_here(fn, args))
            os.write(w, len(data).to_bytes(8, "little"))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + limit_s
    buffer, need = bytearray(), 8
    outcome: tuple[str, Any] | None = None
    while outcome is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome = ("timeout", "no answer within the time limit")
        elif select.select([r], [], [], min(remaining, POLL_S))[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break  # the child is gone before its reply was whole
            buffer += chunk
            if need == 8 and len(buffer) >= 8:
                need = 8 + int.from_bytes(buffer[:8], "little")
                if need > MAX_REPLY_BYTES:
                    outcome = ("error", f"a reply of {need} bytes is over the limit of {MAX_REPLY_BYTES}")
            if outcome is None and len(buffer) >= need > 8:
                try:
                    outcome = tuple(loads_plain(bytes(buffer[8:need])))  # type: ignore[assignment]
                except Exception:  # noqa: BLE001 - a forged reply is a failed task
                    outcome = ("error", "the task's reply could not be read")
        elif _process_count() > config["max_processes"]:
            outcome = ("error", f"the task started more than {config['max_processes']} processes")
    os.close(r)
    exit_code = _kill_all(pid)
    if outcome is None:
        return "crash", f"the task's process died (exit code {exit_code}; memory limit?)"
    return outcome


def _kill_all(child: int) -> int | None:
    """Kill every process of the namespace but the host (PID 1) and reap them all; ``child``'s exit code."""
    code = None
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            while True:
                pid, status = os.waitpid(-1, 0)
                if pid == child:
                    code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        try:
            os.kill(-1, 0)
        except ProcessLookupError:
            return code


def _wipe_scratch() -> bool:
    """Empty ``/tmp`` for the next task; False if something stays."""
    for entry in os.scandir("/tmp"):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_writable_and_retry)
            else:
                os.unlink(entry.path)
        except OSError:
            return False
    return not os.listdir("/tmp")


def _writable_and_retry(fn: Any, path: str, _: Any) -> None:
    """A task may take write permission off its own folders; give it back and try again."""
    os.chmod(os.path.dirname(path), 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        shutil.rmtree(path, onerror=lambda *a: None)
    else:
        fn(path)


# --- the pool's side ---------------------------------------------------------------------------

class HostProcess:
    """The pool's view of a host process, shaped like ``multiprocessing.Process`` (what the pool uses)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.sentinel = os.pidfd_open(popen.pid)  # readable once the process has exited

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        """Kill the host's process group: the launcher and the sandbox's PID 1, and with it every task."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        try:
            os.close(self.sentinel)
        except OSError:
            pass


class HostWorker:
    """One confined host and the pool's end of its socket; the same surface as the pool's ``_Worker``."""

    def __init__(self, backend: Backend, imports: list[str], *, fresh: bool, memory_limit_mb: int | None,
                 scratch_mb: int, max_processes: int, max_tasks: int | None = None) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        view = default_view(scratch_mb, extra=(package_root,))
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        outside = [package_root, *(os.path.abspath(p or os.getcwd()) for p in sys.path)]
        within = [inside(p) for p in outside]  # code under /tmp is shown elsewhere (confine.RELOCATED)
        config = {"backend": backend, "fd": theirs.fileno(), "imports": imports, "fresh": fresh, "max_tasks": max_tasks,
                  "memory_limit_mb": memory_limit_mb, "scratch_mb": scratch_mb, "max_processes": max_processes,
                  "visible": view.visible, "links": view.links, "sys_path_inside": within,
                  # bwrap starts the host confined; the namespaces backend imports this module before it confines
                  "sys_path": within if backend == "bwrap" else outside}
        if backend == "bwrap":
            argv = bwrap_argv(view) + [inside(sys.executable), "-I", "-c", _BOOT, json.dumps(config)]
        else:
            argv = [sys.executable, "-I", "-c", _BOOT, json.dumps(config)]
        popen = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), env=SANDBOX_ENV, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.process = HostProcess(popen)
        self.tasks_done = 0
        self.ready = False
        self.failure = ""

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for the host's confinement and imports; False if it died, failed or took longer."""
        if not self.ready:
            try:
                if not self.conn.poll(timeout_s):
                    return False
                first = self.receive()
            except (EOFError, OSError, pickle.UnpicklingError):
                return False
            self.ready = first == READY
            if not self.ready:
                self.failure = str(first[1]) if isinstance(first, tuple) and len(first) == 2 else repr(first)[:200]
        return self.ready

    def send(self, task_id: int, fn: Any, args: tuple[Any, ...], limit_s: float) -> None:
        self.conn.send((task_id, fn, args, limit_s))

    def receive(self) -> Any:
        """The host's next message, as plain data (``loads_plain``)."""
        return loads_plain(self.conn.recv_bytes(MAX_REPLY_BYTES + 1024))

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                kill = True
            self.process.join(timeout=5.0)
        self.process.kill()  # the whole group, also after a clean exit: no process of it outlives the pool
        self.process.join(timeout=5.0)
        self.process.close()
        self.conn.close()
