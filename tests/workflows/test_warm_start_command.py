"""``m2flow warm-start CONFIG``: only a workflow's warm start, and where the model is; what it refuses, in one line.
(A warm start that runs: tests/workflows/agentic/test_own_task.py.)"""

from __future__ import annotations

from m2flow.cli import main


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_config_without_a_warm_start_is_one_error_line(tmp_path, capsys):
    code = main(["warm-start", "examples/embodied/cartpole_pipelined.yaml", f"run_dir={tmp_path}/run"])
    err = error_lines(capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: examples/embodied/cartpole_pipelined.yaml declares no warm start")
    assert not (tmp_path / "run").exists()


def test_a_workflow_that_has_no_warm_start_at_all_is_one_error_line(tmp_path, capsys):
    code = main(["warm-start", "examples/runtime_demo.yaml", f"run_dir={tmp_path}/run"])
    err = error_lines(capsys)
    assert code == 2 and err == ["error: workflow 'runtime_demo' has no warm start"], err


def test_a_config_whose_warm_start_has_no_steps_is_one_error_line(tmp_path, capsys):
    code = main(["warm-start", "examples/agentic/guess_number_grpo.yaml", f"run_dir={tmp_path}/run",
                 "model.warm_start.steps=0"])
    err = error_lines(capsys)
    assert code == 1 and len(err) == 1 and "declares no warm start" in err[0], err


def test_a_bad_override_is_one_error_line(tmp_path, capsys):
    code = main(["warm-start", "examples/agentic/guess_number_grpo.yaml", "model.warm_start.nope=1"])
    err = error_lines(capsys)
    assert code == 2 and len(err) == 1 and "model.warm_start.nope" in err[0], err
