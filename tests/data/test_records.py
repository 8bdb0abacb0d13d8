"""Reading jsonl/parquet records: bad-line policy, formats, equivalence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m2flow.config.errors import InputError
from m2flow.data.records import BadRecordError, DataNotFoundError, read_records, write_jsonl, write_parquet

ROWS = [
    {"prompt": "1+1=", "answer": "2"},
    {"prompt": "2+3=", "answer": "5", "level": 1},
    {"prompt": "9-4=", "answer": "5"},
]


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_reads_records_with_line_numbers(tmp_path):
    path = _write_lines(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS[:2]] + ["", json.dumps(ROWS[2])])
    report = read_records(path)
    assert [r.data for r in report.records] == ROWS
    # The blank line 3 is skipped silently and line numbers stay those of the file.
    assert [r.line for r in report.records] == [1, 2, 4]
    assert report.num_skipped == 0


def test_invalid_json_raises_with_file_and_line(tmp_path):
    path = _write_lines(tmp_path / "d.jsonl", [json.dumps(ROWS[0]), "{not json", json.dumps(ROWS[1])])
    with pytest.raises(BadRecordError) as info:
        read_records(path)
    assert str(info.value).startswith(f"{path}:2: invalid JSON")
    assert info.value.line == 2


def test_non_object_line_is_bad(tmp_path):
    path = _write_lines(tmp_path / "d.jsonl", [json.dumps(ROWS[0]), "[1, 2]"])
    with pytest.raises(BadRecordError, match=r"d\.jsonl:2: expected a JSON object, got list"):
        read_records(path)


def test_missing_required_key_raises_with_line(tmp_path):
    path = _write_lines(tmp_path / "d.jsonl", [json.dumps(ROWS[0]), json.dumps({"prompt": "x"}), json.dumps(ROWS[1])])
    with pytest.raises(BadRecordError, match=r"d\.jsonl:2: missing key\(s\) \['answer'\]"):
        read_records(path, required_keys=("prompt", "answer"))


def test_skip_counts_bad_lines_and_keeps_good_ones(tmp_path):
    lines = [json.dumps(ROWS[0]), "{oops", json.dumps({"prompt": "x"}), "7", json.dumps(ROWS[1])]
    path = _write_lines(tmp_path / "d.jsonl", lines)
    report = read_records(path, on_bad_line="skip", required_keys=("prompt", "answer"))
    assert [r.data for r in report.records] == ROWS[:2]
    assert report.num_skipped == 3
    assert [s.split(": ")[0] for s in report.skipped] == [f"{path}:2", f"{path}:3", f"{path}:4"]


def test_parquet_and_jsonl_give_the_same_records(tmp_path):
    rows = [dict(r, level=r.get("level")) for r in ROWS]  # parquet has one schema for all rows
    a = read_records(write_jsonl(tmp_path / "d.jsonl", rows))
    b = read_records(write_parquet(tmp_path / "d.parquet", rows))
    assert [r.data for r in a.records] == [r.data for r in b.records] == rows
    assert [r.line for r in b.records] == [1, 2, 3]


def test_parquet_null_required_key_reports_row(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", [ROWS[0], {"prompt": "3+3=", "answer": None}])
    with pytest.raises(BadRecordError, match=r"d\.parquet:2: missing key"):
        read_records(path, required_keys=("answer",))
    assert read_records(path, on_bad_line="skip", required_keys=("answer",)).num_skipped == 1


def test_unknown_format_missing_file_and_bad_policy(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="unknown dataset format '.csv'"):
        read_records(tmp_path / "d.csv")
    with pytest.raises(DataNotFoundError, match="dataset file not found: .*absent.jsonl"):
        read_records(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="on_bad_line must be 'error' or 'skip'"):
        read_records(tmp_path / "d.csv", on_bad_line="ignore")  # type: ignore[arg-type]
