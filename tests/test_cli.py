import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from m2flow import __version__
from m2flow.cli import main
from m2flow.commands import register_command, registered_commands, unregister_command
from m2flow.driver.registry import register_workflow, unregister_workflow

from tests.config.example_schemas import TrainCfg

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_workflow(monkeypatch):
    """A registered workflow whose runs record the config they got and exit with 7."""
    from m2flow.driver.workflow import Workflow
    from m2flow.planner import Component, WorkflowGraph

    seen = []

    def run(workflow, cfg):
        assert workflow.name == "fake_cli"
        seen.append(cfg)
        return 7

    graph = WorkflowGraph("fake_cli", (Component("only", "does the work"),), ())
    register_workflow(type("Fake", (Workflow,), {"name": "fake_cli", "schema": TrainCfg, "graph": graph})())
    monkeypatch.setattr("m2flow.autoplan.entry.run", run)
    yield seen
    unregister_workflow("fake_cli")


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "fake.yaml"
    path.write_text("workflow: fake_cli\nseed: 1\nactor:\n  model_path: /m\n")
    return path


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("train", "config", "demo", "version"):
        assert name in out


def test_every_module_that_registers_a_command_is_listed_in_the_cli():
    """The command line is wired in one place: a module under m2flow/ that calls ``register_command``
    is cli.py itself or one of ``COMMAND_MODULES`` (else its command would never be loaded)."""
    import ast

    from m2flow.cli import COMMAND_MODULES

    registering = set()
    for path in (REPO / "m2flow").rglob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", getattr(n.func, "attr", None)) == "register_command"]
        if calls and path.name != "commands.py":
            registering.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    assert registering == {"m2flow.cli", *COMMAND_MODULES}


def test_help_lists_every_packaged_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("eval", "plan", "profile", "report", "data"):
        assert f"    {name} " in out, name


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage: m2flow" in capsys.readouterr().out


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"m2flow {__version__}\n"
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"m2flow {__version__}\n"


def test_unknown_subcommand_is_a_usage_error(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_train_runs_the_workflow_with_overrides(fake_workflow, config_file):
    assert main(["train", str(config_file), "seed=4", "actor.optim.lr=0.5"]) == 7
    (cfg,) = fake_workflow
    assert isinstance(cfg, TrainCfg)
    assert (cfg.seed, cfg.actor.optim.lr, cfg.actor.model_path) == (4, 0.5, Path("/m"))


def test_unknown_workflow_exits_2_listing_the_registered(fake_workflow, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("workflow: nope\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: workflow: unknown workflow 'nope'; registered workflows:")
    assert "fake_cli" in err and "Traceback" not in err


def test_config_error_is_one_clean_line(fake_workflow, config_file, capsys):
    assert main(["train", str(config_file), "actor.optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: actor.optim.lrr: unknown key; did you mean 'lr'? allowed keys: lr, betas, steps\n"
    )
    assert fake_workflow == []


def test_missing_config_file(capsys, tmp_path):
    assert main(["train", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err == f"error: config file not found: {tmp_path / 'absent.yaml'}\n"


def test_config_show_prints_the_resolved_yaml(fake_workflow, config_file, capsys):
    assert main(["config", "show", str(config_file), "cluster.num_cpus=6"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["workflow"] == "fake_cli"
    assert shown["seed"] == 1 and shown["cluster"]["num_cpus"] == 6
    assert shown["actor"]["optim"] == {"lr": 0.001, "betas": [0.9, 0.999], "steps": 100}


def test_config_docs_prints_every_field(fake_workflow, capsys):
    assert main(["config", "docs", "fake_cli"]) == 0
    out = capsys.readouterr().out
    assert "actor.optim.lr: float = 0.001\n    learning rate\n" in out
    assert "actor.model_path: path = (required)\n    directory of the model\n" in out
    assert "cluster.address: str | None = null\n" in out
    assert "actor.mode: 'collocated' | 'disaggregated' | 'hybrid' = collocated\n" in out


def test_config_docs_documents_the_runtime_demo(capsys):
    from m2flow.config.schema import undocumented
    from m2flow.workflows.runtime_demo.workflow import RuntimeDemoConfig

    assert main(["config", "docs", "runtime_demo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# workflow runtime_demo: m2flow.workflows.runtime_demo.workflow.RuntimeDemoConfig\n")
    assert "placement: str = 'producer: 0-1, scaler,reducer: 2-3'\n" in out
    assert "steps: int = 20\n    batches each producer rank emits\n" in out
    assert "batch_size: int = 4096\n" in out and "cluster.address: str | None = null\n" in out
    # Not the settings of `m2flow demo` (the arithmetic GRPO demo).
    assert "grpo_steps" not in out
    assert undocumented(RuntimeDemoConfig) == []


def test_config_docs_without_a_name_lists_workflows(fake_workflow, capsys):
    assert main(["config", "docs"]) == 0
    assert "fake_cli" in capsys.readouterr().out


def test_plugged_in_command_runs():
    calls = []
    register_command(
        "echo-test",
        "test command",
        lambda parser: parser.add_argument("word"),
        lambda args: calls.append(args.word) or 0,
    )
    try:
        assert "echo-test" in registered_commands()
        assert main(["echo-test", "hi"]) == 0
        assert calls == ["hi"]
        with pytest.raises(ValueError, match="already registered"):
            register_command("echo-test", "again", lambda parser: None, lambda args: 0)
    finally:
        unregister_command("echo-test")


def test_demo_passes_its_overrides(monkeypatch):
    demo = pytest.importorskip("m2flow.workflows.reasoning.demo")
    got = []
    monkeypatch.setattr(demo, "run_demo", lambda overrides, say: got.append(overrides) or 0)
    assert main(["demo", "a.b=1", "c=2"]) == 0
    assert got == [["a.b=1", "c=2"]]


def test_demo_with_an_unknown_key_fails_naming_it_before_any_work(tmp_path, capsys):
    assert main(["demo", "grpo_steps=5", f"run_dir={tmp_path / 'x'}"]) == 2
    assert "grpo_steps" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_python_dash_m_help_without_heavy_imports():
    result = subprocess.run(
        [sys.executable, "-m", "m2flow", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: m2flow")
    # Building the full parser (plug-ins included) must not pull in torch or ray.
    probe = (
        "import sys; from m2flow.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_command_refusing_bad_input_prints_one_error_line(tmp_path, capsys):
    assert main(["report", "--last", "0", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: --last must be >= 1 and --skip >= 0\n"
    assert main(["eval", str(tmp_path)]) == 1  # a directory without a model
    assert capsys.readouterr().err == f"error: {tmp_path} holds no model (no config.json)\n"
