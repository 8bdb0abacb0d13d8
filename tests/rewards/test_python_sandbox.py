"""Escapes from the python tool's sandbox: each is refused, the trainer is unharmed, the failure counted.

Every test runs on each backend (bubblewrap where ``bwrap`` works, the kernel's namespaces where
unshare is allowed) and skips with the reason where a backend is not available.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from m2flow.rewards import confine
from m2flow.rewards.confine import SandboxUnavailable, default_view
from m2flow.rewards.tools.calls import format_result
from m2flow.rewards.tools.python import PythonTool
from m2flow.rewards.tools.registry import ToolBox
from m2flow.runtime.auth import ENV_VAR, secret_hex

BACKENDS = ["bwrap", "namespaces"]


@pytest.fixture(scope="module", params=BACKENDS)
def tool(request):
    why = confine.probe(request.param)
    if why is not None:
        pytest.skip(f"no {request.param} sandbox here: {why}")
    t = PythonTool(timeout_s=1.0, memory_limit_mb=512, isolation=request.param, scratch_mb=8, max_processes=16)
    yield t
    t.close()


def run(tool: PythonTool, code: str) -> str:
    return tool(code)


def test_snippet_semantics_are_kept(tool):
    assert run(tool, "print(6*7)\n2**10") == "42\n1024"
    assert run(tool, "x = 'a' * 5000\nx").endswith("...(cut)")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run(tool, "1/0")


def test_files_outside_the_scratch_dir_cannot_be_written_deleted_or_renamed(tool, tmp_path):
    victim = tmp_path / "checkpoint.pt"
    victim.write_text("weights")
    package = os.path.dirname(confine.__file__)  # shown to the sandbox, read-only
    code = f"""
import os
for attempt in (lambda: open({str(victim)!r}, 'a').write('x'), lambda: os.remove({str(victim)!r}),
                lambda: os.rename({str(victim)!r}, '/tmp/stolen'), lambda: open({package!r} + '/planted.py', 'w'),
                lambda: os.remove({confine.__file__!r}), lambda: os.chmod({package!r}, 0o777)):
    try:
        attempt()
        print('done')
    except OSError as exc:
        print(type(exc).__name__)
"""
    out = run(tool, code).split()
    assert "done" not in out and len(out) == 6
    assert victim.read_text() == "weights"
    assert not os.path.exists(os.path.join(package, "planted.py")) and os.path.exists(confine.__file__)


def test_run_dir_home_and_the_run_secret_are_out_of_sight(tool, tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}")
    secret = secret_hex()
    home = os.path.expanduser("~")
    code = f"""
import os
print(os.path.exists({str(run_dir)!r}), os.environ.get({ENV_VAR!r}))
print(sorted(os.listdir({home!r})) if os.path.isdir({home!r}) else [])
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            print(open(f'/proc/{{pid}}/environ', 'rb').read())
        except OSError:
            pass
"""
    out = run(tool, code)
    assert secret not in out and ENV_VAR not in out
    first, listing = out.splitlines()[:2]
    assert first == "False None"
    # Of the home directory only the folders that lead to the Python installation are shown.
    shown = {p[len(home):].strip("/").split("/")[0] for p in default_view().visible if p.startswith(home + "/")}
    assert set(eval(listing)) <= shown  # noqa: S307 - a list of names printed by the snippet


def test_other_processes_are_invisible_and_cannot_be_signalled(tool):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        code = f"""
import os
pids = [p for p in os.listdir('/proc') if p.isdigit()]
for target in ({victim.pid}, {os.getpid()}, 1):
    try:
        os.kill(target, 9)
        print('sent', target)
    except OSError as exc:
        print(type(exc).__name__)
for name in ('cmdline', 'environ'):
    try:
        open('/proc/{os.getpid()}/' + name, 'rb').read()
        print('read')
    except OSError as exc:
        print(type(exc).__name__)
print(len(pids))
"""
        lines = run(tool, code).splitlines()
        assert lines[:2] == ["ProcessLookupError", "ProcessLookupError"]  # not in its PID namespace
        assert "read" not in lines
        assert int(lines[-1]) <= 3  # the host, the snippet (and a launcher)
        time.sleep(0.1)
        assert victim.poll() is None  # still alive
        assert run(tool, "print('host alive')") == "host alive"  # PID 1 ignored the signal
    finally:
        victim.kill()
        victim.wait()


def test_a_fork_bomb_is_stopped_and_the_next_call_is_clean(tool):
    with pytest.raises(RuntimeError, match="more than 16 processes|BlockingIOError|Resource temporarily"):
        run(tool, "import os\nwhile True:\n    os.fork()")
    assert run(tool, "import os; len([p for p in os.listdir('/proc') if p.isdigit()])") in ("1", "2", "3")


def test_the_scratch_dir_is_bounded_and_wiped_between_calls(tool):
    out = run(tool, "import os\ntry:\n    open('/tmp/big', 'wb').write(b'x' * (64 << 20))\nexcept OSError as e:\n"
                    "    print(type(e).__name__)\nopen('/tmp/leftover', 'w').write('x')\n"
                    "import subprocess; subprocess.Popen(['sleep', '100'])\nprint(os.listdir('/tmp'))")
    assert out.splitlines()[0] == "OSError" and "leftover" in out
    after = run(tool, "import os; print(os.listdir('/tmp'), len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert after.split()[0] == "[]" and int(after.split()[1]) <= 3  # no file, no sleeping process


def test_memory_is_bounded(tool):
    with pytest.raises(RuntimeError, match="MemoryError|died"):
        run(tool, "x = bytearray(4 * 1024 ** 3)")


def test_no_network_nor_sockets_outside(tool, tmp_path):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp.setblocking(False)
    path = str(tmp_path / "trainer.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen()
    unix.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0m2flow-test-{os.getpid()}")
    abstract.listen()
    abstract.setblocking(False)
    code = f"""
import socket
for family, address in ((socket.AF_INET, ('127.0.0.1', {tcp.getsockname()[1]})), (socket.AF_UNIX, {path!r}),
                        (socket.AF_UNIX, '\\0m2flow-test-{os.getpid()}')):
    try:
        socket.socket(family).connect(address)
        print('connected')
    except OSError as exc:
        print(type(exc).__name__)
"""
    try:
        out = run(tool, code).split()
        assert "connected" not in out and len(out) == 3
        for listener in (tcp, unix, abstract):
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        for s in (tcp, unix, abstract):
            s.close()


def test_subprocesses_run_confined(tool):
    out = run(tool, "import subprocess; print(subprocess.run(['id', '-u'], capture_output=True, text=True).stdout)")
    assert out.strip() == str(confine.SANDBOX_ID)


def test_failures_are_counted_and_the_episode_goes_on(tool):
    box = ToolBox([tool], timeout_s=5.0)
    replies = [box.respond(f"<tool>python: {code}</tool>") for code in
               ("open('/etc/passwd', 'a')", "while True: pass", "import os; os.kill(1, 9); print('ok')", "print(1)")]
    assert [r.outcome for r in replies] == ["error", "timeout", "ok", "ok"]
    assert replies[-1].observation == format_result("1")
    assert (box.stats.errors, box.stats.timeouts, box.stats.ok) == (1, 1, 2)


# --- no sandbox: the tool refuses, unless told to accept the risk ------------------------------

@pytest.fixture
def no_sandbox(monkeypatch):
    monkeypatch.setattr(confine, "probe", lambda backend: f"{backend} unavailable (simulated)")


def test_without_a_sandbox_the_tool_refuses_in_one_line(no_sandbox):
    with pytest.raises(SandboxUnavailable) as refused:
        ToolBox.from_names(["python"])
    message = str(refused.value)
    assert "\n" not in message and "allow_unsandboxed: true" in message and "simulated" in message
    with pytest.raises(SandboxUnavailable, match="isolation 'bwrap' is not available"):
        PythonTool(isolation="bwrap")
    with pytest.raises(SandboxUnavailable, match="allow_unsandboxed"):
        PythonTool(isolation="none")
    with pytest.raises(ValueError, match="isolation must be one of"):
        PythonTool(isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allow_unsandboxed must be true or false"):
        PythonTool(allow_unsandboxed="yes")  # type: ignore[arg-type]


def test_allow_unsandboxed_runs_the_old_way(no_sandbox):
    box = ToolBox.from_names(["python"], python={"allow_unsandboxed": True, "timeout_s": 5.0})
    try:
        tool = box.tools["python"]
        assert tool.backend is None and tool.pool.backend is None
        code = ("import socket\nprint(6*7)\ntry:\n    socket.create_connection(('127.0.0.1', 9))\nexcept OSError:\n"
                "    print('refused')")  # the network is still cut, as before the sandbox
        assert box.respond(f"<tool>python: {code}</tool>").observation == format_result("42\nrefused")
    finally:
        box.close()


def test_bubblewrap_missing_falls_to_namespaces(monkeypatch):
    if confine.probe("namespaces") is not None:
        pytest.skip("unshare is refused here")
    monkeypatch.setenv("PATH", "/nonexistent")
    real = confine.probe.__wrapped__
    monkeypatch.setattr(confine, "probe", real)  # uncached, under the PATH without bwrap
    assert real("bwrap") is not None and confine.resolve("auto") == "namespaces"


@pytest.mark.skipif(sys.platform != "linux", reason="Linux namespaces")
def test_signals_from_outside_still_stop_the_host(tool):
    pid = tool.pool._workers[0].process.pid
    assert run(tool, "print(1)") == "1"
    os.killpg(pid, signal.SIGKILL)  # what the pool does at a host's deadline
    tool.pool._workers[0].process.join(5.0)
    assert not tool.pool._workers[0].process.is_alive()
    assert run(tool, "print(2)") == "2"  # a fresh host took its place
