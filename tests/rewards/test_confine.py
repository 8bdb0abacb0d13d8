"""The reward sandbox's view: checks import their code but cannot read the run's files or write anywhere."""

from __future__ import annotations

import os

import pytest

from m2flow.rewards import confine
from m2flow.rewards.confine import default_view
from m2flow.rewards.sandbox import SandboxPool
from m2flow.rewards.sandbox_host import loads_plain, plain
from m2flow.runtime.auth import secret_hex
from tests.rewards import sandbox_checks as checks


@pytest.fixture(scope="module", params=["bwrap", "namespaces"])
def pool(request):
    why = confine.probe(request.param)
    if why is not None:
        pytest.skip(f"no {request.param} sandbox here: {why}")
    with SandboxPool(num_workers=1, timeout_s=30.0, preload=(), isolation=request.param) as p:
        yield p


def test_reward_checks_see_code_but_not_the_trainers_files(pool: SandboxPool, tmp_path):
    victim = tmp_path / "reference_answers.jsonl"
    victim.write_text("42")
    code = confine.inside(checks.__file__)  # where the sandbox shows this file (elsewhere when it is under /tmp)
    results, stats = pool.map(checks.try_read, [(str(victim), ""), (code, "")])
    assert [r.value for r in results] == ["FileNotFoundError", open(checks.__file__).read(100)]
    source = open(checks.__file__).read()
    results, _ = pool.map(checks.try_write, [(str(victim), ""), (code, ""), ("/tmp/scratch.txt", "")])
    assert [r.value for r in results] == ["FileNotFoundError", "OSError", "written"]  # OSError: read-only file system
    assert victim.read_text() == "42" and open(checks.__file__).read() == source
    results, _ = pool.map(checks.environment, [("", "")])
    assert secret_hex() not in results[0].value and "M2FLOW" not in results[0].value
    assert stats.failures == 0


def test_a_confined_worker_that_crashes_or_hangs_is_replaced(pool: SandboxPool):
    results, stats = pool.map(checks.crashing_check, [("", "")])
    assert results[0].status == "crash" and stats.crashes == 1 and stats.restarts == 1
    results, stats = pool.map(checks.slow_check, [("", "")], timeout_s=0.5)
    assert results[0].status == "timeout" and stats.timeouts == 1
    assert pool.map(checks.equal_check, [("a", "a")])[0][0].value == 1.0


def test_a_project_dir_shows_its_code_not_its_runs(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "my_reward.py").write_text("")
    (project / "runs" / "run" / "checkpoints").mkdir(parents=True)
    (project / "data.jsonl").write_text("")
    monkeypatch.setattr("sys.path", [str(project)])
    assert set(confine._project_entries(str(project))) == {str(project / "pkg"), str(project / "my_reward.py")}
    view = default_view()
    assert str(project / "pkg") in view.visible and str(project / "runs") not in view.visible
    # Under /tmp, which the sandbox mounts afresh as its scratch: shown elsewhere, the scratch stays empty.
    assert confine.inside(str(project / "pkg")) == confine.RELOCATED + str(project / "pkg")
    assert confine.inside("/usr/lib") == "/usr/lib"


def test_replies_are_plain_data_only():
    import pickle

    assert loads_plain(pickle.dumps(plain({"a": (1, 2.5, None, True)}))) == {"a": [1, 2.5, None, True]}
    with pytest.raises(pickle.UnpicklingError, match="plain data only"):
        loads_plain(pickle.dumps(os.system))  # a forged reply that would call a function in the trainer
    assert os.environ.get("M2FLOW_RUN_SECRET")  # the trainer has a secret the sandbox never sees
