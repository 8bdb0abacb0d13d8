"""The supervised warm start as a model-preparation step: learns, is saved in run_dir, is reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from m2flow.config import from_dict
from m2flow.config.errors import ConfigError
from m2flow.workflows.reasoning import warm_start
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.data import prepare_model

torch.set_num_threads(1)


def _config(root: Path, **warm: object) -> ReasoningConfig:
    return from_dict(ReasoningConfig, {
        "run_dir": str(root / "run"),
        "model": {"path": str(root / "base"), "create_tiny": True,
                  "tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64, "max_position_embeddings": 32},
                  "warm_start": {"steps": 40, "batch_size": 32, "lr": 0.003, "warmup_steps": 5, "source": "teacher",
                                 **warm}},
        "data": {"arithmetic": {"digits": 1, "operators": ["+"], "train_size": 60, "test_size": 8,
                                "reverse_answer": True, "pad_operands": True, "teacher_slip_rate": 0.5}},
        "metrics": {"sinks": ["jsonl"]},
    })


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / warm_start.METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return [r["warm_start/loss"] for r in rows]


@pytest.mark.learning
def test_warm_start_learns_and_saves_its_model_in_the_run_directory(tmp_path):
    cfg = _config(tmp_path)
    path = warm_start.warm_start_model(cfg, prepare_model(cfg.model, cfg.data))
    assert path == tmp_path / "run" / warm_start.WARM_START_DIR
    assert (path / "config.json").is_file() and (path / warm_start.SETTINGS_FILE).is_file()
    losses = _losses(tmp_path / "run")
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses  # it fits the demonstrations


def test_a_warm_start_with_the_same_settings_is_reused_and_a_different_one_redone(tmp_path, monkeypatch):
    cfg = _config(tmp_path, steps=3)
    base = prepare_model(cfg.model, cfg.data)
    first = warm_start.warm_start_model(cfg, base)
    calls = []
    import m2flow.models.sft as sft

    real = sft.sft_steps
    monkeypatch.setattr(sft, "sft_steps", lambda *a, **k: calls.append(k["steps"]) or real(*a, **k))
    assert warm_start.warm_start_model(cfg, base) == first and calls == []  # a resumed run: no training
    changed = _config(tmp_path, steps=4)
    assert warm_start.warm_start_model(changed, base) == first and calls == [4]
    assert len(_losses(tmp_path / "run")) == 4  # the metrics describe the warm start that is in place


def test_teacher_demonstrations_slip_at_the_configured_rate(tmp_path):
    cfg = _config(tmp_path, steps=50, batch_size=40)  # 2,000 demonstrations
    from m2flow.workflows.reasoning.data import arithmetic_task

    task = arithmetic_task(cfg.data)
    pairs = warm_start.demonstrations(cfg, None)
    assert len(pairs) == 2000
    wrong = sum(answer != task.answer(*task.parse(prompt)) for prompt, answer in pairs)
    carries = sum(task.slip(*task.parse(p)) != task.solve(*task.parse(p)) for p, _ in pairs)
    # Only problems with a carry can come out wrong, and about half of those do.
    assert 0.4 * carries < wrong < 0.6 * carries, (wrong, carries)


def test_the_running_sums_teacher_slips_on_problems_whose_sum_wraps(tmp_path):
    cfg = _config(tmp_path, steps=50, batch_size=40)
    cfg.data.kind = "running_sums"
    cfg.data.running_sums.max_steps, cfg.data.running_sums.teacher_slip_rate = 6, 0.5
    from m2flow.workflows.reasoning.data import synthetic_task

    task = synthetic_task(cfg.data)
    pairs = warm_start.demonstrations(cfg, None)
    assert len(pairs) == 2000
    wrong = sum(answer != task.solve(task.parse(prompt)) for prompt, answer in pairs)
    wraps = sum(task.slip(task.parse(p)) != task.solve(task.parse(p)) for p, _ in pairs)
    assert 0.4 * wraps < wrong < 0.6 * wraps, (wrong, wraps)
    model = prepare_model(cfg.model, cfg.data)  # its tokenizer: one token per character of the task
    from m2flow.models.causal_lm import load_model_and_tokenizer

    _, tokenizer = load_model_and_tokenizer(str(model))
    prompt, answer = pairs[0]
    assert tokenizer.decode(tokenizer.encode(prompt + answer, add_special_tokens=False)) == prompt + answer


def test_the_teacher_needs_a_synthetic_data_kind():
    with pytest.raises(ConfigError, match="warm_start.source.*'arithmetic', 'running_sums'"):
        from_dict(ReasoningConfig, {"model": {"warm_start": {"source": "teacher", "steps": 1}},
                                    "data": {"kind": "file", "path": "x.jsonl"}})


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _file_config(root: Path, file: Path, **warm: object) -> ReasoningConfig:
    return _config(root, source="file", file=str(file), steps=3, batch_size=4, **warm)


def test_a_file_of_prompt_response_pairs_is_trained_on_its_responses_and_reused_until_it_changes(tmp_path, monkeypatch):
    demos = _write(tmp_path / "demos.jsonl", [json.dumps({"prompt": "1+2=", "response": "3"}), "",
                                              json.dumps({"prompt": "4+4=", "response": "8", "note": "extra keys ok"})])
    cfg = _file_config(tmp_path, demos)
    import m2flow.models.sft as sft

    seen = []
    real = sft.sft_steps
    monkeypatch.setattr(sft, "sft_steps", lambda model, tok, pairs, **k: seen.append(list(pairs)) or real(model, tok, pairs, **k))
    base = prepare_model(cfg.model, cfg.data)
    first = warm_start.warm_start_model(cfg, base)
    # (prompt, response) pairs: sft_steps puts the loss on the response's tokens (and end-of-sequence) only.
    assert seen == [[("1+2=", "3"), ("4+4=", "8")]] and len(_losses(tmp_path / "run")) == 3
    saved = json.loads((first / warm_start.SETTINGS_FILE).read_text())
    assert saved["file_sha256"] == warm_start.file_hash(str(demos))
    assert warm_start.warm_start_model(cfg, base) == first and len(seen) == 1  # same settings, same file: reused
    _write(demos, [json.dumps({"prompt": "1+2=", "response": "4"})])  # the same name, other content
    assert warm_start.warm_start_model(cfg, base) == first and seen[-1] == [("1+2=", "4")]


@pytest.mark.parametrize("lines, error", [
    (None, r"model.warm_start.file: .*missing.jsonl does not exist"),
    (['{"prompt": "1+2=", "response": "3"}', '{"prompt": "1+'], r"model.warm_start.file: .*demos.jsonl:2: invalid JSON"),
    (['{"prompt": "1+2=", "response": "3"}', "", '{"prompt": "2+2="}'],
     r"model.warm_start.file: .*demos.jsonl:3: missing key\(s\) \['response'\]"),
    (['{"prompt": "1+2=", "response": 3}'], r"model.warm_start.file: .*demos.jsonl:1: 'response' is not a string"),
    ([""], r"model.warm_start.file: .*demos.jsonl holds no demonstrations"),
])
def test_a_bad_demonstrations_file_is_one_error_line_naming_file_and_line(tmp_path, lines, error):
    from m2flow.config.errors import InputError

    file = tmp_path / "missing.jsonl" if lines is None else _write(tmp_path / "demos.jsonl", lines)
    cfg = _file_config(tmp_path, file)
    with pytest.raises(InputError, match=error) as info:
        warm_start.demonstrations(cfg, None)
    assert "\n" not in str(info.value)


def test_the_file_source_needs_a_file_and_a_file_needs_the_file_source():
    with pytest.raises(ConfigError, match="model.warm_start.file: source 'file' needs a file"):
        from_dict(ReasoningConfig, {"model": {"warm_start": {"source": "file", "steps": 1}}})
    with pytest.raises(ConfigError, match="model.warm_start.file: read only with source 'file'"):
        from_dict(ReasoningConfig, {"model": {"warm_start": {"file": "x.jsonl", "steps": 1}}})
