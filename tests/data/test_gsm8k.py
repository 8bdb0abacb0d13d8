"""GSM8K reader on the real data set, and its reference extraction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m2flow.data.gsm8k import extract_gsm8k_reference, gsm8k_dataset, read_gsm8k
from m2flow.data.records import BadRecordError, DataNotFoundError
from m2flow.models.tokenizer import train_char_tokenizer

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason="GSM8K data not present")


def test_extract_reference():
    assert extract_gsm8k_reference("so 9 * 2 = 18\n#### 18") == "18"
    assert extract_gsm8k_reference("#### 1,234") == "1234"
    assert extract_gsm8k_reference("####-7 ") == "-7"
    assert extract_gsm8k_reference("no marker") is None


@needs_gsm8k
def test_real_test_split():
    records, skipped = read_gsm8k(GSM8K, "test")
    assert skipped == 0
    assert len(records) == 1319  # the published size of the GSM8K test split
    first = records[0].data
    assert first["question"].startswith("Janet")
    assert first["answer"] == "18"
    assert first["solution"].endswith("#### 18")
    # Every reference is a plain (possibly negative or decimal) number once commas are gone.
    assert all(r.data["answer"].lstrip("-").replace(".", "", 1).isdigit() for r in records)


@needs_gsm8k
def test_real_data_as_prompt_dataset():
    lines = (GSM8K / "train.jsonl").read_text(encoding="utf-8").splitlines()[:50]
    chars = "".join(json.loads(line)["question"] for line in lines) + "QuestionAnswer:#'\n"
    tok = train_char_tokenizer([chars])
    ds = gsm8k_dataset(GSM8K, tok, "train", limit=20)
    assert len(ds) == 20
    assert ds[0].prompt.startswith("Question: ") and ds[0].prompt.endswith("Answer:")
    assert ds[0].answer == json.loads(lines[0])["answer"].split("####")[-1].strip().replace(",", "")
    assert ds[0].extra["solution"] == json.loads(lines[0])["answer"]


def test_missing_marker_is_a_bad_line(tmp_path):
    path = tmp_path / "test.jsonl"
    rows = [{"question": "q1", "answer": "x\n#### 3"}, {"question": "q2", "answer": "no number"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(BadRecordError, match=r"test\.jsonl:2: answer has no '#### <number>'"):
        read_gsm8k(tmp_path, "test")
    records, skipped = read_gsm8k(path, on_bad_line="skip")
    assert [r.data["answer"] for r in records] == ["3"] and skipped == 1
    with pytest.raises(DataNotFoundError, match="no train.jsonl .*m2flow data gsm8k"):
        read_gsm8k(tmp_path, "train")
