"""Prepare GSM8K from files the user downloaded: ``<out>/train.jsonl`` and ``<out>/test.jsonl``.

m2flow ships no data set and downloads none. GSM8K's published files come as jsonl
(``train.jsonl``, ``test.jsonl``) or as parquet shards (``train-00000-of-00001.parquet``); either
way each record has ``question`` and ``answer`` (a worked solution ending in ``#### <number>``).
``prepare_gsm8k`` reads them, takes the split from each file name, checks every record (a bad one
fails naming its file and line), and writes the directory ``data.kind: gsm8k`` reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from m2flow.config.errors import InputError
from m2flow.data.gsm8k import read_gsm8k
from m2flow.data.records import JSONL_SUFFIXES, PARQUET_SUFFIXES, DataNotFoundError

SPLITS = ("train", "test")


def split_of(path: Path) -> str | None:
    """``"train"`` or ``"test"`` from a file name (``train.jsonl``, ``test-00000-of-00001.parquet``), else None."""
    name = path.name.lower()
    return next((s for s in SPLITS if name.startswith(s)), None)


def source_files(sources: list[Path]) -> dict[str, list[Path]]:
    """The data files of each split among ``sources`` (files, or directories searched one level deep)."""
    found: dict[str, list[Path]] = {s: [] for s in SPLITS}
    suffixes = JSONL_SUFFIXES + PARQUET_SUFFIXES
    for source in sources:
        if not source.exists():
            raise DataNotFoundError(f"{source} does not exist")
        files = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else [source]
        data = [f for f in files if f.suffix.lower() in suffixes and split_of(f) is not None]
        if not data:
            raise InputError(f"{source}: no GSM8K file (a name starting with 'train' or 'test', ending in "
                             f"{', '.join(suffixes)})")
        for f in data:
            found[split_of(f)].append(f)  # type: ignore[index]
    return found


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    """Write jsonl rows to ``path`` through a sibling file, so a crash never leaves half a split."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def prepare_gsm8k(sources: list[Path], out: Path) -> dict[str, int]:
    """Write ``out/<split>.jsonl`` (``question``, ``answer``) for every split found in ``sources``;
    returns the number of records per split written."""
    found = source_files(sources)
    if not found["train"]:
        raise InputError(f"no training split among {', '.join(map(str, sources))}: a GSM8K file whose name "
                         "starts with 'train' is needed (test files alone cannot train)")
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for split, files in found.items():
        if not files:
            continue
        rows = []
        for f in files:
            records, _ = read_gsm8k(f, split, on_bad_line="error")
            rows += [{"question": r.data["question"], "answer": r.data["solution"]} for r in records]
        _write(out / f"{split}.jsonl", rows)
        counts[split] = len(rows)
    return counts
