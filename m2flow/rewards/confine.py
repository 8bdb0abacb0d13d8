"""Confinement of sandbox processes: which isolation a machine offers, and how a process is put in it.

A confined process sees a minimal read-only view of the file system: the system's libraries and
programs (``/usr`` and its links), the Python installation and the code on ``sys.path``. Of a
project directory on ``sys.path`` (the working directory, ``PYTHONPATH``) only its Python packages
(folders with ``__init__.py``) and top-level ``.py`` modules are shown, so a run directory, checkpoints
and data next to the code stay out of sight. Its only writable place is ``/tmp``, a private tmpfs of
``scratch_mb``. It has a ``/proc`` of its own PID namespace (only its own processes), a ``/dev`` with
``null``, ``zero``, ``full``, ``random`` and ``urandom``, no network (a network namespace with no
interface), no capabilities, and runs as uid/gid 65534 (``nobody``) of a user namespace of its own.
Its environment is rebuilt from scratch, so ``$M2FLOW_RUN_SECRET`` (``runtime/auth.py``) never
reaches it.

Two backends give that view:

- ``bwrap``: bubblewrap, a small setuid-free launcher (a Debian package, ``bubblewrap``) that many
  sandboxes (Flatpak among them) rely on; a well-kept tool is preferred where present.
- ``namespaces``: the same done here with the kernel's unprivileged user namespaces (``unshare``,
  ``mount``, ``pivot_root`` through ``ctypes``), for machines without bubblewrap.

``resolve`` picks one for an ``Isolation`` setting; it returns None for ``none`` and for ``auto``
where neither works, and the caller decides whether that is allowed (``PythonTool`` refuses).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "namespaces", "none"]
Backend = Literal["bwrap", "namespaces"]
ISOLATIONS: tuple[str, ...] = ("auto", "bwrap", "namespaces", "none")

SANDBOX_ID = 65534
"""The uid and gid inside the sandbox (``nobody``): the trainer's own uid maps to it, root maps to nothing."""
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
"""What a dynamically linked program needs from the system (Debian's multiarch libraries are found
through ``ld.so.cache``)."""
SHADOWED = ("/tmp", "/proc", "/dev")
"""Paths the sandbox mounts afresh: code found under them (a project or a virtualenv cloned under
``/tmp``) is shown under ``RELOCATED`` instead (``inside``)."""
RELOCATED = "/outside"
"""Where the sandbox shows code whose own path it shadows: ``/tmp/x/pkg`` is ``/outside/tmp/x/pkg`` there."""
DEVICES = ("null", "zero", "full", "random", "urandom")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
"""The whole environment of a sandbox process: nothing of the trainer's (its run secret least of all)."""


class SandboxUnavailable(RuntimeError):
    """The isolation that was asked for cannot be had on this machine."""


@dataclass(frozen=True)
class View:
    """What a confined process sees: ``visible`` paths read-only (``links``: symlinks recreated as they
    are), and a private ``/tmp`` of ``scratch_mb`` MiB."""

    visible: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    scratch_mb: int = 64


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def inside(path: str) -> str:
    """Where the sandbox shows ``path``: the same path, except under a path it mounts afresh (``SHADOWED``),
    whose code it shows under ``RELOCATED`` (its scratch ``/tmp`` stays empty)."""
    return RELOCATED + path if any(_inside(path, p) for p in SHADOWED) else path


def _project_entries(directory: str) -> list[str]:
    """The importable code of a project directory: its packages and top-level modules, no data."""
    out = []
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if name.endswith(".py") and os.path.isfile(full):
            out.append(full)
        elif os.path.isfile(os.path.join(full, "__init__.py")):
            out.append(full)
    return out


def default_view(scratch_mb: int = 64, extra: tuple[str, ...] = ()) -> View:
    """The view of this process's Python: system paths, the installation, and the code on ``sys.path``."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    paths: list[str] = []
    links: list[tuple[str, str]] = []
    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            links.append((os.readlink(p), p))
        elif os.path.exists(p):
            paths.append(p)
    paths.extend(sorted(prefixes))
    paths.append(os.path.dirname(os.path.realpath(sys.executable)))
    for entry in [*sys.path, *extra]:
        entry = os.path.realpath(entry or os.getcwd())
        if not os.path.exists(entry):
            continue
        if os.path.isfile(entry) or any(_inside(entry, p) for p in prefixes):
            paths.append(entry)  # a zip, or inside the installation: shown whole
        elif os.path.isdir(entry):
            paths.extend(_project_entries(entry))
    visible: list[str] = []
    for p in sorted(set(paths), key=lambda s: (s.count("/"), s)):  # parents first: drop what they hold
        if not any(_inside(p, v) for v in visible) and not any(_inside(p, link) for _, link in links):
            visible.append(p)
    return View(tuple(visible), tuple(links), scratch_mb)


def bwrap_argv(view: View) -> list[str]:
    """The ``bwrap`` command line that confines the command appended to it (the host runs as PID 1)."""
    # The absolute path: the sandbox's own PATH, under which the launcher is started, may not hold it.
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--hostname", "sandbox", "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        argv += ["--setenv", key, value]
    for target, link in view.links:
        argv += ["--symlink", target, link]
    for path in view.visible:
        argv += ["--ro-bind", path, inside(path)]
    argv += ["--dev", "/dev", "--proc", "/proc", "--size", str(view.scratch_mb << 20), "--perms", "1777",
             "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    return argv


# --- the namespaces backend: run inside the process being confined -------------------------------

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# statvfs flag -> mount flag: a remount inside a user namespace must keep the flags the owner locked.
_LOCKED_FLAGS = {os.ST_NOSUID: _MS_NOSUID, os.ST_NODEV: _MS_NODEV, os.ST_NOEXEC: _MS_NOEXEC,
                 os.ST_NOATIME: 1024, os.ST_NODIRATIME: 2048, os.ST_RELATIME: 1 << 21}


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _ok(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _ok(_libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {source} on {target}")


def _bind_read_only(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, _MS_BIND | _MS_REC)
    flags = os.statvfs(target).f_flag
    locked = sum(ms for st, ms in _LOCKED_FLAGS.items() if flags & st)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | locked)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _base_dir(view: View) -> str:
    """An existing directory to build the new root on, that holds none of the paths to be shown."""
    for candidate in ("/mnt", "/media", "/srv", "/opt", "/tmp", "/var/tmp"):
        if os.path.isdir(candidate) and not any(_inside(p, candidate) for p in view.visible):
            return candidate
    raise SandboxUnavailable("no directory to build the sandbox's root on")


def enter_namespaces(view: View) -> None:
    """Move this (single-threaded) process into the sandbox; returns in a child that is PID 1 there.

    The calling process stays outside the new PID namespace, waits for that child and exits with its
    exit code; if it is killed, the child is killed with it (``PR_SET_PDEATHSIG``), and with the
    child every process of the namespace.
    """
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    _ok(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS),
        "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{SANDBOX_ID} {uid} 1")
    _write("/proc/self/gid_map", f"{SANDBOX_ID} {gid} 1")
    pid = os.fork()
    if pid:
        _stay_outside(pid)
    _ok(libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PDEATHSIG)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    root = _base_dir(view)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for target, link in view.links:
        os.symlink(target, root + link)
    for path in view.visible:
        _bind_read_only(path, root + inside(path))
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={view.scratch_mb}m,mode=1777")
    os.makedirs(root + "/dev")
    _mount("tmpfs", root + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "a").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, _MS_BIND)
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        os.symlink(f"/proc/self/fd/{fd}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.chdir(root)
    _ok(libc.syscall(_SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _ok(libc.umount2(b".", _MNT_DETACH), "umount the old root")
    os.chdir("/")
    _mount(None, "/dev", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    libc.sethostname(b"sandbox", 7)
    os.chdir("/tmp")
    _drop_privileges()


def _stay_outside(pid: int) -> None:
    """The process outside the PID namespace: wait for the sandbox's PID 1 and exit as it did."""
    for fd in range(3, 1024):  # the pipe to the pool belongs to the child alone
        try:
            os.close(fd)
        except OSError:
            pass
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)  # killed by signal N: exit 128 + N, as a shell reports it


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


def _drop_privileges() -> None:
    """No capabilities, none to be gained by exec, and not traceable by the code it will run."""
    libc = _libc()
    _ok(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
    _ok(libc.capset(ctypes.byref(header), data), "capset")
    _ok(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")


# --- which backend this machine offers ---------------------------------------------------------

def probe_command(backend: Backend, view: View) -> list[str]:
    """A command that succeeds only where ``backend`` can confine a process with ``view``."""
    code = "import os; os.listdir('/tmp')"
    if backend == "bwrap":
        return [*bwrap_argv(view), inside(sys.executable), "-I", "-S", "-c", code]
    boot = (f"import sys; sys.path[:0] = {[os.path.dirname(os.path.dirname(os.path.dirname(__file__)))]!r}; "
            f"from m2flow.rewards.confine import enter_namespaces, default_view; "
            f"enter_namespaces(default_view()); {code}")
    return [sys.executable, "-I", "-S", "-c", boot]


@functools.lru_cache(maxsize=None)
def probe(backend: Backend) -> str | None:
    """None when ``backend`` works on this machine, else why not (one line). Run once per process."""
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian package: bubblewrap)"
    try:
        done = subprocess.run(probe_command(backend, default_view()), env=SANDBOX_ENV, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=30, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{backend}: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"{backend} refused: {last}"
    return None


def resolve(isolation: Isolation) -> Backend | None:
    """The backend for ``isolation``: ``auto`` prefers bubblewrap, then namespaces, else None; a named
    backend that does not work raises ``SandboxUnavailable``; ``none`` is None."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}; got {isolation!r}")
    if isolation == "none":
        return None
    if isolation != "auto":
        why = probe(isolation)
        if why is not None:
            raise SandboxUnavailable(f"isolation {isolation!r} is not available here: {why}")
        return isolation
    for backend in ("bwrap", "namespaces"):
        why = probe(backend)
        if why is None:
            return backend
        logger.debug("sandbox backend %s unavailable: %s", backend, why)
    return None


def why_unavailable() -> str:
    """Why ``resolve("auto")`` found nothing, one line."""
    return "; ".join(f"{why}" for why in (probe("bwrap"), probe("namespaces")) if why)
