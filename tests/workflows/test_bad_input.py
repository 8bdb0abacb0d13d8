"""Bad input to `m2flow train` is one `error:` line naming the file, line or key, with exit code 2."""

from __future__ import annotations

import pytest

from m2flow.cli import main

EXAMPLE = "examples/reasoning/arithmetic_grpo.yaml"


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n')
    (tmp_path / "nokey.jsonl").write_text('{"prompt": "1+1=", "ans": "2"}\n')
    return tmp_path


@pytest.mark.parametrize("overrides, words", [
    (["data.kind=file", "data.path={d}/empty.jsonl"], "{d}/empty.jsonl) has no records"),
    (["data.kind=file", "data.path={d}/broken.jsonl"], "{d}/broken.jsonl:2: invalid JSON"),
    (["data.kind=file", "data.path={d}/nokey.jsonl"], "{d}/nokey.jsonl:1: missing key(s) ['answer']"),
    (["model.create_tiny=false"], "model.path: {d}/model does not exist"),
    (["reward.fn=nope"], "reward.fn: unknown reward function 'nope'; valid names:"),
    (["reward.fn=os:nothing_here"], "reward.fn: module 'os' has no attribute 'nothing_here'"),
    (["resume={d}"], "{d} is not a checkpoint (no trainer_state.json)"),
])
def test_each_bad_input_is_one_error_line(bad_files, capsys, overrides, words):
    d = str(bad_files)
    args = [o.format(d=d) for o in overrides]
    code = main(["train", EXAMPLE, *args, "placement=local", "steps=1", "model.warm_start_steps=0",
                 f"model.path={d}/model", f"run_dir={d}/run", "metrics.sinks=[jsonl]"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert err and err[-1].startswith("error: ") and words.format(d=d) in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_an_unquoted_placement_override_keeps_its_text(capsys):
    assert main(["plan", "show", "examples/embodied/cartpole_pipelined.yaml", "placement=env: 0, rollout: 1, actor: 0"]) == 0
    assert "placement 'env: 0, rollout: 1, actor: 0'" in capsys.readouterr().out
