"""A task of your own, end to end: an environment and a teacher in a module of their own (written to a
temporary directory, named in ``env.imports``), with an action format of brackets and capitals
(``[[LOOKUP: K]]``, then ``ANSWER: K``) that the shipped tokenizer could not write; warm-started from the
teacher and from a JSONL file (``m2flow warm-start``), trained with GRPO, and evaluated from its checkpoint
(``m2flow eval``)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from m2flow.autoplan.entry import train
from m2flow.cli import main
from m2flow.config import to_yaml
from m2flow.workflows.agentic.warm_start import SETTINGS_FILE, WARM_START_DIR
from m2flow.workflows.agentic.workflow import WORKFLOW
from tests.workflows.agentic.own_task import own_config, write_module

EVAL_KEYS = {"eval/return_mean", "eval/success", "eval/turns_mean", "eval/tool_calls"}


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    """The directory of the task's module, on the import path."""
    directory = tmp_path_factory.mktemp("own-task-module")
    write_module(directory)
    return directory


def write_config(path, cfg) -> str:
    path.write_text(to_yaml(cfg, workflow="agentic"))
    return str(path)


def weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_warm_start_from_the_teacher_and_from_a_file_then_train_and_eval(module_dir, tmp_path, capsys):
    """The cheap run of the whole path: ``m2flow warm-start`` from the teacher, and from a JSONL file of the
    same episodes (the same weights); two GRPO iterations from the warm start; ``m2flow eval`` of the checkpoint.
    (Learning is asserted by the slow test below.)"""
    import own_lookup_task

    from m2flow.data.teachers import TeachRequest

    small = {"model.warm_start.steps": 6, "model.warm_start.batch_size": 8, "steps": 2, "eval_every": 2,
             "checkpoint_every": 2, "eval_episodes": 8, "episodes.groups_per_step": 2, "episodes.group_size": 2}
    teacher_cfg = own_config(tmp_path, run_dir=str(tmp_path / "teacher"), **small)
    assert main(["warm-start", write_config(tmp_path / "teacher.yaml", teacher_cfg)]) == 0
    from_teacher = tmp_path / "teacher" / WARM_START_DIR
    assert capsys.readouterr().out.strip().endswith(f"warm-started model (agentic, model.warm_start): {from_teacher}")
    tokens = json.loads((from_teacher / "tokenizer.json").read_text())["model"]["vocab"]
    assert {"[", "]", "L", "O", "K", "U", "P", "N", "S", "W", "E", "R"} <= set(tokens)  # it can write the actions

    # The teacher's own episodes, as a user would write them: the same warm start from the file.
    demos = own_lookup_task.teacher(TeachRequest(count=6 * 8, seed=0, env_kwargs={"keys": 2},
                                                 options={"skip_rate": 0.5}))
    file = tmp_path / "demos.jsonl"
    file.write_text("".join(json.dumps({"prompt": d.prompt, "turns": list(d.turns)}) + "\n" for d in demos))
    file_cfg = own_config(tmp_path, run_dir=str(tmp_path / "file"),
                          **{**small, "model.warm_start.demonstrations": str(file)})
    config = write_config(tmp_path / "file.yaml", file_cfg)
    assert main(["warm-start", config]) == 0
    from_file = tmp_path / "file" / WARM_START_DIR
    a, b = weights(from_teacher), weights(from_file)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    settings = json.loads((from_file / SETTINGS_FILE).read_text())
    assert len(settings["file_sha256"]) == 64
    rows = (tmp_path / "file" / "warm_start.jsonl").read_text().splitlines()
    assert len(rows) == 6 and "warm_start/loss" in json.loads(rows[-1])  # one progress row a step

    # The same file again: reused; another content: trained again.
    stamp = (from_file / SETTINGS_FILE).stat().st_mtime_ns
    assert main(["warm-start", config]) == 0
    assert (from_file / SETTINGS_FILE).stat().st_mtime_ns == stamp
    file.write_text(file.read_text() + json.dumps({"prompt": "Fetch A.", "turns": ["ANSWER: A"]}) + "\n")
    assert main(["warm-start", config]) == 0
    assert json.loads((from_file / SETTINGS_FILE).read_text())["file_sha256"] != settings["file_sha256"]
    stamp = (from_file / SETTINGS_FILE).stat().st_mtime_ns

    # Training reuses the warm start; m2flow eval reads the checkpoint back: the run's own held-out evaluation.
    result = train(WORKFLOW, file_cfg)
    assert (from_file / SETTINGS_FILE).stat().st_mtime_ns == stamp
    out = tmp_path / "eval.json"
    capsys.readouterr()
    assert main(["eval", "--output", str(out), str(result.last_checkpoint)]) == 0
    assert json.loads(out.read_text()) == {k: dict(result.evaluations)[2][k] for k in EVAL_KEYS}
    assert "over 8 held-out episodes (own_lookup)" in capsys.readouterr().out.strip().splitlines()[-1]

    # A bad line: one error line naming the file and the line.
    file.write_text(file.read_text() + '{"prompt": "Fetch B.", "turns": ["[[LOOKUP: B]]", " B OK "]}\n')
    assert main(["warm-start", config]) == 2
    assert f"{file}:{6 * 8 + 2}: 'turns' must have an odd length" in one_error_line(capsys)


def test_an_unknown_teacher_is_one_error_line_listing_the_teachers(module_dir, tmp_path, capsys):
    cfg = own_config(tmp_path, **{"model.warm_start.steps": 2})
    config = write_config(tmp_path / "own.yaml", cfg)
    assert main(["warm-start", config, "model.warm_start.teacher=nobody"]) == 2
    line = one_error_line(capsys)
    assert "unknown teacher 'nobody'" in line and "own_lookup" in line and "calculator" in line


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_grpo_raises_the_held_out_success_of_the_warm_started_policy(module_dir, tmp_path, capsys):
    # The teacher fetches before delivering in half of its episodes; GRPO learns to always fetch. Held-out
    # success sampled at temperature 1 over 200 episodes, before and after 10 iterations: over seeds 0-2 under
    # the default and AVX2 float paths it rose by 0.39-0.46 (0.42-0.51 -> 0.875-0.905; docs/your_own_task.md).
    cfg = own_config(tmp_path, checkpoint_every=10)
    result = train(WORKFLOW, cfg)
    (_, before), (_, after) = result.evaluations
    assert after["eval/success"] >= before["eval/success"] + 0.15, result.evaluations

    # m2flow eval reads the checkpoint back: the run's own held-out evaluation of those weights, to the bit.
    out = tmp_path / "eval.json"
    assert main(["eval", "--output", str(out), str(result.last_checkpoint)]) == 0
    assert json.loads(out.read_text()) == {k: after[k] for k in EVAL_KEYS}


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_the_own_task_trains_on_ray_ranks(module_dir, tmp_path, monkeypatch):
    import os

    from tests.ray_session import shared_cluster, stop_ray

    # Ray's worker processes import env.imports too: the module's directory is on their path as on a user's.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(module_dir), os.environ.get("PYTHONPATH", "")]))
    stop_ray()  # the shared cluster starts again, its workers with this path
    cfg = own_config(tmp_path, placement="env: 0-1, rollout: 0, actor: 1")
    result = train(WORKFLOW, cfg, cluster=shared_cluster())
    assert result.plan.executor == "ray" and result.plan["env"].world_size == 2
    (_, before), (_, after) = result.evaluations
    assert after["eval/success"] >= before["eval/success"] + 0.15, result.evaluations
