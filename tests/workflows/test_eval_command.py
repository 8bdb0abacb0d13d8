"""``m2flow eval`` dispatches on the workflow a checkpoint records; what it cannot dispatch is one error line."""

from __future__ import annotations

import pytest

from m2flow.cli import main
from m2flow.driver.checkpoints import write_state
from m2flow.driver.registry import get_workflow
from m2flow.workflows.eval_command import MODEL_DIRECTORY, checkpoint_workflow


def _error_line(capsys, code: int) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(err) == 1 and err[0].startswith("error: "), (code, err)
    return err[0]


def _checkpoint(path, workflow):
    path.mkdir()
    write_state(path, {"workflow": workflow, "next_step": 1})
    return path


def test_a_directory_without_a_trainer_state_is_a_reasoning_model(tmp_path):
    assert checkpoint_workflow(tmp_path) == MODEL_DIRECTORY == "reasoning"
    assert checkpoint_workflow(_checkpoint(tmp_path / "step_000001", "agentic")) == "agentic"


def test_a_path_that_is_no_directory_is_refused(tmp_path, capsys):
    line = _error_line(capsys, main(["eval", str(tmp_path / "missing")]))
    assert line == f"error: {tmp_path / 'missing'} is not a directory (a checkpoint or a model directory)"


def test_a_checkpoint_of_an_unknown_workflow_is_refused_naming_the_known_ones(tmp_path, capsys):
    line = _error_line(capsys, main(["eval", str(_checkpoint(tmp_path / "step_000001", "nosuch"))]))
    assert "was written by a workflow not found here: unknown workflow 'nosuch'" in line
    assert "agentic" in line and "embodied" in line


def test_a_workflow_without_checkpoint_evaluation_says_so(tmp_path, capsys):
    path = _checkpoint(tmp_path / "step_000001", "runtime_demo")
    line = _error_line(capsys, main(["eval", str(path)]))
    assert line == f"error: workflow 'runtime_demo' cannot evaluate a checkpoint ({path})"


def test_config_is_refused_for_a_checkpoint_that_carries_its_own(tmp_path, capsys):
    path = _checkpoint(tmp_path / "step_000001", "embodied")
    line = _error_line(capsys, main(["eval", "--config", "x.yaml", str(path)]))
    assert line.startswith("error: --config is for reasoning checkpoints; this embodied checkpoint carries its own")


@pytest.mark.parametrize("name, takes", [("reasoning", True), ("embodied", False), ("agentic", False)])
def test_each_workflow_declares_whether_it_reads_an_eval_config(name, takes):
    workflow = get_workflow(name)
    assert workflow.takes_eval_config is takes
    assert type(workflow).evaluate_checkpoint is not type(get_workflow("runtime_demo")).evaluate_checkpoint

