"""Bad input to `m2flow train` and `m2flow eval` is one `error:` line naming the file, line or key, with exit
code 2 and no traceback: also when a worker meets it (a model file, a checkpoint, a reward's output)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

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
    code = main(["train", EXAMPLE, *args, "placement=local", "steps=1", "model.warm_start.steps=0", "model.warm_start.source=answers",
                 f"model.path={d}/model", f"run_dir={d}/run", "metrics.sinks=[jsonl]"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert err and err[-1].startswith("error: ") and words.format(d=d) in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_an_unquoted_placement_override_keeps_its_text(capsys):
    assert main(["plan", "show", "examples/embodied/cartpole_pipelined.yaml", "placement=env: 0, rollout: 1, actor: 0"]) == 0
    assert "placement 'env: 0, rollout: 1, actor: 0'" in capsys.readouterr().out


# ----------------------------------------------------------------------------- files and functions met by workers

TINY = [EXAMPLE, "placement=local", "model.warm_start.steps=0", "model.warm_start.source=answers",
        "model.tiny.hidden_size=32", "data.prompts_per_step=4", "eval_size=8", "metrics.sinks=[jsonl]"]


class _Poison:
    """A pickle that would run a shell command when loaded."""

    def __reduce__(self):
        import os

        return (os.system, ("echo loaded-and-ran",))


def _poison(path: Path) -> None:
    """Replace ``path`` by a pickle carrying code; a checkpoint's file manifest is updated to match, as an
    attacker able to write the file could do."""
    torch.save({"x": _Poison()}, path)
    state_file = path.parent / "trainer_state.json"
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        if path.name in state.get("files", {}):
            state["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
            state_file.write_text(json.dumps(state))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny reasoning model with a two-step run's checkpoints, an embodied run's checkpoint, and broken
    copies of the model: truncated, header overwritten, weights as a pickle that carries code."""
    d = tmp_path_factory.mktemp("made")
    assert main(["train", *TINY, "steps=2", "checkpoint_every=1", f"model.path={d}/model", f"run_dir={d}/run"]) == 0
    assert main(["train", "examples/embodied/cartpole_pipelined.yaml", "placement=local", "total_env_steps=1024",
                 "checkpoint_every=1", "trace=false", f"run_dir={d}/erun", "metrics.sinks=[jsonl]"]) == 0
    for name in ("truncated", "header", "pickle"):
        shutil.copytree(d / "model", d / name)
    weights = d / "truncated" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    raw = bytearray((d / "header" / "model.safetensors").read_bytes())
    raw[8:40] = b"x" * 32  # the JSON header starts after its 8-byte length
    (d / "header" / "model.safetensors").write_bytes(bytes(raw))
    (d / "pickle" / "model.safetensors").unlink()
    _poison(d / "pickle" / "pytorch_model.bin")
    shutil.copytree(d / "run", d / "poisoned")
    _poison(d / "poisoned" / "checkpoints" / "step_000002" / "training_state.pt")
    shutil.copytree(d / "erun", d / "epoisoned")
    _poison(d / "epoisoned" / "checkpoints" / "step_000001" / "actor.pt")
    return d


def _one_error_line(capsys, code: int) -> str:
    """The one ``error:`` line of a command that refused its input (exit 2, no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "weights_only" not in err  # torch's advice to load a refused pickle anyway is never repeated
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (["data.kind=file", "data.path={d}/missing.jsonl"], "dataset file not found: {d}/missing.jsonl"),
    (["data.kind=gsm8k", "data.path={d}/gsm8k"], "GSM8K path not found: {d}/gsm8k; m2flow ships no data set"),
    (["model.path={d}/truncated"], "{d}/truncated/model.safetensors: not a readable safetensors file"),
    (["model.path={d}/header"], "{d}/header/model.safetensors: not a readable safetensors file"),
    (["model.path={d}/pickle"], "{d}/pickle/pytorch_model.bin: refused to load"),
    (["run_dir={d}/poisoned", "resume={d}/poisoned/checkpoints/step_000002"],
     "{d}/poisoned/checkpoints/step_000002/training_state.pt: refused to load"),
    (["reward.fn=tests.workflows.toy_reward:one_score_short"],
     "reward.fn: batched reward function 'tests.workflows.toy_reward:one_score_short' returned 7 scores for 8"),
    (["rollout.sampling.max_new_tokens=1024"], "rollout.sampling.max_new_tokens: 1024 tokens do not fit in the 1024 "
                                               "positions"),
])
def test_each_bad_input_met_while_training_is_one_error_line(made, tmp_path, capsys, args, words):
    d = str(made)
    given = [a.format(d=d) for a in args]
    defaults = [f"model.path={d}/model", f"run_dir={tmp_path}/run"]
    defaults = [a for a in defaults if a.split("=")[0] not in {g.split("=")[0] for g in given}]
    line = _one_error_line(capsys, main(["train", *TINY, "steps=3", *defaults, *given]))
    assert words.format(d=d) in line, line


@pytest.mark.parametrize("args, words", [
    (["{d}/epoisoned/checkpoints/step_000001", "--episodes", "1"],
     "{d}/epoisoned/checkpoints/step_000001/actor.pt: refused to load"),
    (["--config", EXAMPLE, "{d}/truncated", "limit=4"], "{d}/truncated/model.safetensors: not a readable"),
    (["--config", EXAMPLE, "{d}/pickle", "limit=4"], "{d}/pickle/pytorch_model.bin: refused to load"),
    (["--config", EXAMPLE, "{d}/model", "limit=4", "max_new_tokens=4096"],
     "max_new_tokens: 4096 tokens do not fit in the 1024 positions"),
    (["--config", EXAMPLE, "{d}/model", "data.kind=file", "data.path={d}/missing.jsonl", "split=train"],
     "dataset file not found: {d}/missing.jsonl"),
    (["--config", EXAMPLE, "{d}/model", "data.kind=file", "data.path={d}/missing.jsonl"],
     "split: the data has no 'test' split"),
])
def test_each_bad_input_to_eval_is_one_error_line(made, capsys, args, words):
    d = str(made)
    line = _one_error_line(capsys, main(["eval", *[a.format(d=d) for a in args]]))
    assert words.format(d=d) in line, line
