"""Read records (one dict per example) from jsonl or parquet files, with bad-line policy."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Literal

from m2flow.config.errors import InputError

logger = logging.getLogger(__name__)

OnBadLine = Literal["error", "skip"]
"""What to do with an unreadable record: raise naming file and line, or skip and count it."""

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class BadRecordError(InputError):
    """A record could not be read or lacks a required key; the message starts with `file:line`."""

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = str(path)
        self.line = line
        self.reason = reason


class DataNotFoundError(InputError):
    """A data file or directory that does not exist; the message names it."""


@dataclass
class Record:
    """One example as read from disk, with where it came from (line is 1-based; a row number for parquet)."""

    data: dict[str, Any]
    path: str
    line: int


@dataclass
class ReadReport:
    """Records read from a file, and the bad lines that were skipped (as `file:line: reason`)."""

    records: list[Record] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        """Number of bad lines skipped."""
        return len(self.skipped)


def _check_policy(on_bad_line: str) -> None:
    if on_bad_line not in ("error", "skip"):
        raise ValueError(f"on_bad_line must be 'error' or 'skip', got {on_bad_line!r}")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """Yield (line, object, error) for each non-blank line."""
    with path.open("r", encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            text = raw.strip()
            if not text:
                # Blank lines (e.g. a trailing newline) are formatting, not data.
                continue
            try:
                yield lineno, json.loads(text), None
            except json.JSONDecodeError as e:
                yield lineno, None, f"invalid JSON ({e.msg})"


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """Yield (row, object, None) for each row; rows are numbered from 1 like lines."""
    import pyarrow.parquet as pq  # optional dependency; only needed for parquet files

    for row, obj in enumerate(pq.read_table(path).to_pylist(), start=1):
        yield row, obj, None


def read_records(
    path: str | Path,
    on_bad_line: OnBadLine = "error",
    required_keys: tuple[str, ...] = (),
) -> ReadReport:
    """Read every record of a jsonl or parquet file; records missing a required key (or with it null) are bad."""
    _check_policy(on_bad_line)
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(f"dataset file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        rows = _iter_jsonl(path)
    elif suffix in PARQUET_SUFFIXES:
        rows = _iter_parquet(path)
    else:
        raise InputError(
            f"unknown dataset format {suffix!r} for {path}; expected one of {JSONL_SUFFIXES + PARQUET_SUFFIXES}"
        )
    report = ReadReport()
    for line, obj, error in rows:
        if error is None and not isinstance(obj, dict):
            error = f"expected a JSON object, got {type(obj).__name__}"
        if error is None:
            missing = [k for k in required_keys if obj.get(k) is None]
            if missing:
                error = f"missing key(s) {missing}; has {sorted(obj)}"
        if error is not None:
            if on_bad_line == "error":
                raise BadRecordError(path, line, error)
            report.skipped.append(f"{path}:{line}: {error}")
            continue
        report.records.append(Record(obj, str(path), line))
    if report.skipped:
        logger.warning("skipped %d bad line(s) in %s (first: %s)", report.num_skipped, path, report.skipped[0])
    return report


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as one JSON object per line; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_parquet(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as a parquet table; returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
