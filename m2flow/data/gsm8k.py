"""GSM8K reader: question + worked solution ending in `#### N`; the reference answer is N."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from m2flow.data.prompts import PromptDataset
from m2flow.data.records import BadRecordError, DataNotFoundError, OnBadLine, Record, read_records

GSM8K_PROMPT_TEMPLATE = (
    "Question: {prompt}\n"
    "Work it out step by step, then write the final number after '####'.\n"
    "Answer:"
)
"""Default wording around each question; the `####` marker is what the math reward looks for."""

WHERE_TO_GET = (
    "m2flow ships no data set: download GSM8K's train and test files yourself (jsonl, or the parquet "
    "files of the 'main' configuration of the openai/gsm8k dataset on Hugging Face), then run "
    "`m2flow data gsm8k --from FILE_OR_DIR... --out data/gsm8k` and set data.path to that directory"
)
"""What a missing GSM8K directory's error says, so a user knows where the data comes from."""

_REFERENCE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def extract_gsm8k_reference(solution: str) -> str | None:
    """The final answer after `####` with thousands separators removed ('#### 1,234' -> '1234'); None if absent."""
    match = _REFERENCE.search(solution)
    if match is None:
        return None
    return match.group(1).replace(",", "").strip()


def resolve_split(path: str | Path, split: str) -> Path:
    """A file path is used as is; a directory resolves to `<dir>/<split>.jsonl` (or `.parquet`); a missing
    one raises ``DataNotFoundError`` saying where the data comes from."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise DataNotFoundError(f"GSM8K path not found: {path}; {WHERE_TO_GET}")
    for suffix in (".jsonl", ".parquet"):
        candidate = path / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    raise DataNotFoundError(f"no {split}.jsonl or {split}.parquet in {path}; {WHERE_TO_GET}")


def read_gsm8k(path: str | Path, split: str = "train", on_bad_line: OnBadLine = "error") -> tuple[list[Record], int]:
    """Records with `question`, `solution` (the worked answer) and `answer` (the reference); plus skipped count."""
    file = resolve_split(path, split)
    report = read_records(file, on_bad_line=on_bad_line, required_keys=("question", "answer"))
    records: list[Record] = []
    skipped = report.num_skipped
    for rec in report.records:
        reference = extract_gsm8k_reference(str(rec.data["answer"]))
        if reference is None or reference == "":
            if on_bad_line == "error":
                raise BadRecordError(rec.path, rec.line, "answer has no '#### <number>' reference")
            skipped += 1
            continue
        data: dict[str, Any] = {
            "question": rec.data["question"],
            "solution": rec.data["answer"],
            "answer": reference,
        }
        records.append(Record(data, rec.path, rec.line))
    return records, skipped


def gsm8k_dataset(
    path: str | Path,
    tokenizer: Any,
    split: str = "train",
    *,
    prompt_template: str | None = GSM8K_PROMPT_TEMPLATE,
    use_chat_template: bool = False,
    system_prompt: str | None = None,
    max_prompt_tokens: int | None = None,
    limit: int | None = None,
    on_bad_line: OnBadLine = "error",
) -> PromptDataset:
    """A `PromptDataset` of GSM8K questions whose `answer` is the `####` reference number."""
    records, skipped = read_gsm8k(path, split, on_bad_line)
    if limit is not None:
        records = records[:limit]
    return PromptDataset.from_records(
        records,
        tokenizer,
        prompt_key="question",
        answer_key="answer",
        use_chat_template=use_chat_template,
        system_prompt=system_prompt,
        prompt_template=prompt_template,
        max_prompt_tokens=max_prompt_tokens,
        on_bad_line=on_bad_line,
        num_skipped=skipped,
    )
