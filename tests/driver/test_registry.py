from dataclasses import dataclass
from pathlib import Path

import pytest

from m2flow.config import ConfigError, option
from m2flow.driver.registry import get_workflow, load_workflow_config, register_workflow, unregister_workflow
from m2flow.driver.workflow import Workflow
from m2flow.planner import Component, WorkflowGraph

from tests.config.example_schemas import TrainCfg


@dataclass
class WithWorkflowField:
    workflow: str = option("keeps_key", "the workflow this file is for")
    n: int = option(1, "a number")


def _workflow(name: str, schema: type) -> Workflow:
    """A workflow object of one component, as a plug-in would declare it."""
    graph = WorkflowGraph(name, (Component("only", "does the work"),), ())
    return type("Declared", (Workflow,), {"name": name, "schema": schema, "graph": graph,
                                          "help": "A tiny training workflow."})()


@pytest.fixture
def tiny():
    spec = register_workflow(_workflow("tiny_test", TrainCfg))
    yield spec
    unregister_workflow("tiny_test")


def test_register_and_get(tiny):
    assert get_workflow("tiny_test") is tiny
    assert tiny.help == "A tiny training workflow."


def test_duplicate_and_bad_declarations_raise(tiny):
    with pytest.raises(ValueError, match="already registered"):
        register_workflow(_workflow("tiny_test", TrainCfg))
    with pytest.raises(ValueError, match="lower_snake_case"):
        register_workflow(_workflow("Bad-Name", TrainCfg))
    with pytest.raises(TypeError, match="dataclass"):
        register_workflow(_workflow("not_a_schema", dict))
    mismatched = _workflow("named_one_way", TrainCfg)
    mismatched.graph = WorkflowGraph("another", (Component("only", "does the work"),), ())
    with pytest.raises(ValueError, match="graph must be a WorkflowGraph named"):
        register_workflow(mismatched)


def test_the_shipped_workflows_are_found_on_disk():
    from m2flow.driver.registry import available_workflows

    assert {"runtime_demo", "embodied", "reasoning"} <= set(available_workflows())


def test_unknown_workflow_lists_the_registered_ones(tiny):
    with pytest.raises(ConfigError) as info:
        get_workflow("nope")
    message = str(info.value)
    assert message.startswith("workflow: unknown workflow 'nope'; registered workflows: ")
    assert "tiny_test" in message


def test_load_picks_the_schema_from_the_workflow_key(tiny, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workflow: tiny_test\nactor:\n  model_path: m\n")
    spec, cfg = load_workflow_config(path, ["seed=5"])
    assert spec is tiny
    assert isinstance(cfg, TrainCfg) and cfg.seed == 5 and cfg.actor.model_path == Path("m")


def test_workflow_override_wins_over_the_file(tiny, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workflow: something_else\nactor: {model_path: m}\n")
    spec, _ = load_workflow_config(path, ["workflow=tiny_test"])
    assert spec is tiny


def test_file_without_workflow_key(tiny, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")
    with pytest.raises(ConfigError) as info:
        load_workflow_config(path)
    assert "has no top-level 'workflow:' key" in str(info.value)
    assert "tiny_test" in str(info.value)


def test_required_value_can_come_from_an_override(tiny, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workflow: tiny_test\nactor:\n  model_path: ???\n")
    _, cfg = load_workflow_config(path, ["actor.model_path=/m"])
    assert cfg.actor.model_path == Path("/m")


def test_schema_that_declares_the_workflow_key_keeps_it(tmp_path):
    register_workflow(_workflow("keeps_key", WithWorkflowField))
    try:
        path = tmp_path / "c.yaml"
        path.write_text("workflow: keeps_key\nn: 2\n")
        _, cfg = load_workflow_config(path)
        assert cfg == WithWorkflowField(workflow="keeps_key", n=2)
    finally:
        unregister_workflow("keeps_key")
