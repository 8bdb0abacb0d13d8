"""Datasets and the model of a reasoning run, made ready before any worker starts.

``prepare_model`` builds a tiny random model (and its tokenizer, trained on the run's own data) when
``model.create_tiny`` is set and the directory does not exist yet (the supervised warm start that may
follow is ``m2flow.workflows.reasoning.warm_start``); ``load_datasets`` turns the data section into training
and held-out ``PromptDataset``s.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from m2flow.config.errors import InputError
from m2flow.data import ArithmeticTask, DataNotFoundError, PromptDataset, RunningSumsTask, read_records
from m2flow.data.gsm8k import GSM8K_PROMPT_TEMPLATE, read_gsm8k, resolve_split
from m2flow.data.prompts import format_prompt
from m2flow.workflows.reasoning.config import (
    SYNTHETIC_KINDS,
    ArithmeticDataConfig,
    DataConfig,
    ModelConfig,
    RunningSumsDataConfig,
)

log = logging.getLogger(__name__)

Split = str  # "train" or "test"


def arithmetic_task(data: DataConfig) -> ArithmeticTask:
    """The arithmetic task the data section describes (kind: arithmetic)."""
    a = data.arithmetic
    return ArithmeticTask(digits=a.digits, operators=tuple(a.operators), reverse_answer=a.reverse_answer,
                          pad_operands=a.pad_operands)


def synthetic_task(data: DataConfig) -> ArithmeticTask | RunningSumsTask:
    """The built-in task of a synthetic data kind (``SYNTHETIC_KINDS``): its problems, alphabet and teacher."""
    if data.kind == "arithmetic":
        return arithmetic_task(data)
    if data.kind == "running_sums":
        r = data.running_sums
        return RunningSumsTask(max_steps=r.max_steps, length_tail=r.length_tail)
    raise ValueError(f"data.kind {data.kind!r} is not generated here; synthetic kinds: {list(SYNTHETIC_KINDS)}")


def synthetic_settings(data: DataConfig) -> ArithmeticDataConfig | RunningSumsDataConfig:
    """The section of a synthetic kind's own settings (sizes, seed, the teacher's slip rate)."""
    return data.arithmetic if data.kind == "arithmetic" else data.running_sums


def raw_records(data: DataConfig, split: Split) -> list[Any] | None:
    """The records of one split (dicts or ``Record``s), or None when the data has no such split."""
    if data.kind in SYNTHETIC_KINDS:
        own = synthetic_settings(data)
        size = own.train_size if split == "train" else own.test_size
        return synthetic_task(data).sample(split, size, seed=own.seed)  # type: ignore[arg-type]
    if data.kind == "gsm8k":
        assert data.path is not None
        try:
            resolve_split(data.path, split)
        except DataNotFoundError:
            if split == "train":
                raise
            return None
        records, skipped = read_gsm8k(data.path, split, data.on_bad_line)
    else:
        path = data.path if split == "train" else data.eval_path
        if path is None:
            return None
        required = (data.prompt_key, data.answer_key)
        report = read_records(path, on_bad_line=data.on_bad_line, required_keys=required)
        records, skipped = report.records, report.num_skipped
    if skipped:
        log.warning("%s split: skipped %d bad record(s)", split, skipped)
    return records[: data.limit] if split == "train" and data.limit is not None else records


def _keys(data: DataConfig) -> tuple[str, str]:
    if data.kind == "gsm8k":
        return "question", "answer"
    if data.kind in SYNTHETIC_KINDS:
        return "prompt", "answer"
    return data.prompt_key, data.answer_key


def _template(data: DataConfig) -> str | None:
    if data.prompt_template is None and data.kind == "gsm8k":
        return GSM8K_PROMPT_TEMPLATE
    return data.prompt_template


def prompt_dataset(data: DataConfig, records: list[Any], tokenizer: Any) -> PromptDataset:
    """Formatted, tokenized prompts with their reference answers."""
    prompt_key, answer_key = _keys(data)
    return PromptDataset.from_records(
        records, tokenizer, prompt_key=prompt_key, answer_key=answer_key,
        use_chat_template=data.use_chat_template, system_prompt=data.system_prompt,
        prompt_template=_template(data), max_prompt_tokens=data.max_prompt_tokens,
        on_bad_line=data.on_bad_line,
    )


def load_datasets(data: DataConfig, tokenizer: Any) -> tuple[PromptDataset, PromptDataset | None]:
    """Training prompts and held-out prompts (None when the data has no held-out split)."""
    train = prompt_dataset(data, raw_records(data, "train") or [], tokenizer)
    if len(train) < data.prompts_per_step:
        raise InputError(f"data: {_source(data)} has {len(train)} prompt(s), fewer than prompts_per_step "
                         f"({data.prompts_per_step})")
    test_records = raw_records(data, "test")
    test = prompt_dataset(data, test_records, tokenizer) if test_records else None
    return train, test


def _source(data: DataConfig) -> str:
    """The training data as the user named it, for messages."""
    return f"the training data ({data.path})" if data.path else f"the {data.kind} training data"


def _data(record: Any) -> dict[str, Any]:
    return record.data if hasattr(record, "data") else record


def warm_start_pairs(data: DataConfig, records: list[Any], tokenizer: Any) -> list[tuple[str, str]]:
    """(formatted prompt, target text) for a warm start: GSM8K's worked solution, else the answer."""
    prompt_key, answer_key = _keys(data)
    out = []
    for rec in map(_data, records):
        prompt = format_prompt(str(rec[prompt_key]), tokenizer, data.use_chat_template, data.system_prompt,
                               _template(data))
        target = rec.get("solution", rec[answer_key])
        out.append((prompt, " " + str(target) if data.kind == "gsm8k" else str(target)))
    return out


def file_demonstrations(path: str, data: DataConfig | None = None, tokenizer: Any = None) -> list[tuple[str, str]]:
    """(prompt, response) of each line of a JSONL file of ``{"prompt": ..., "response": ...}`` objects (blank lines
    skipped), each prompt formatted as ``data`` formats the rollout's prompts (as written without ``data``); a
    missing file, a line that is not JSON or lacks a string field raises ``InputError`` naming the file and line."""
    from m2flow.data.records import BadRecordError

    where = "model.warm_start.file"
    try:
        records = read_records(path, on_bad_line="error", required_keys=("prompt", "response")).records
    except DataNotFoundError:
        raise InputError(f"{where}: {path} does not exist") from None
    except InputError as e:  # a bad line: the message starts with file:line
        raise InputError(f"{where}: {e}") from None
    pairs = []
    for rec in records:
        for key in ("prompt", "response"):
            if not isinstance(rec.data[key], str):
                raise InputError(f"{where}: {BadRecordError(rec.path, rec.line, f'{key!r} is not a string')}")
        prompt = rec.data["prompt"]
        if data is not None:
            prompt = format_prompt(prompt, tokenizer, data.use_chat_template, data.system_prompt, _template(data))
        pairs.append((prompt, rec.data["response"]))
    if not pairs:
        raise InputError(f"{where}: {path} holds no demonstrations")
    return pairs


def prepare_model(model: ModelConfig, data: DataConfig) -> Path:
    """The model directory, built first (tiny random model and its tokenizer) when asked and missing."""
    path = Path(model.path)
    if path.is_dir():
        return path
    if not model.create_tiny:
        raise InputError(f"model.path: {path} does not exist (set model.create_tiny to build a tiny model)")
    from m2flow.models.tiny import TinyModelConfig, build_tiny_model, save_checkpoint
    from m2flow.models.tokenizer import train_tokenizer

    records = raw_records(data, "train") or []
    if not records:
        raise InputError(f"data: {_source(data)} has no records to build the tiny model's tokenizer from")
    if data.kind in SYNTHETIC_KINDS:
        texts = [synthetic_task(data).alphabet]
    else:
        texts = [p + t for p, t in warm_start_pairs(data, records, None)]
    if model.warm_start.source == "file" and model.warm_start.file:  # the warm start's own text, tokenized too
        texts += [p + r for p, r in file_demonstrations(model.warm_start.file, data)]
    spec = model.tiny
    tokenizer = train_tokenizer(texts, kind=spec.tokenizer, vocab_size=spec.vocab_size)
    lm = build_tiny_model(TinyModelConfig(
        arch=spec.arch, hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, seed=spec.seed), tokenizer)
    # Written to a sibling first, then renamed: a crash mid-way never leaves a half model at path.
    tmp = path.with_name(path.name + ".partial")
    save_checkpoint(lm, tokenizer, tmp)
    tmp.rename(path)
    log.info("built a tiny %s model at %s", spec.arch, path)
    return path
