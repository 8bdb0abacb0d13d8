"""``m2flow data gsm8k``: GSM8K's published files (jsonl or parquet shards) become the directory
``data.kind: gsm8k`` reads, every record checked; made here from a few hand-written records."""

from __future__ import annotations

import json

import pytest

from m2flow.cli import main
from m2flow.config.errors import InputError
from m2flow.data.gsm8k import read_gsm8k
from m2flow.data.gsm8k_prepare import prepare_gsm8k, split_of
from m2flow.data.records import BadRecordError, DataNotFoundError, write_jsonl, write_parquet

TRAIN = [{"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i}+2=<<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"}
         for i in range(5)]
TEST = [{"question": "What is 1,000 + 234?", "answer": "1,000+234=1,234\n#### 1,234"}]


def test_the_split_comes_from_the_file_name(tmp_path):
    assert split_of(tmp_path / "train-00000-of-00001.parquet") == "train"
    assert split_of(tmp_path / "test.jsonl") == "test"
    assert split_of(tmp_path / "socratic.jsonl") is None


def test_parquet_shards_become_the_directory_the_reader_takes(tmp_path):
    src = tmp_path / "main"
    write_parquet(src / "train-00000-of-00002.parquet", TRAIN[:3])
    write_parquet(src / "train-00001-of-00002.parquet", TRAIN[3:])
    write_parquet(src / "test-00000-of-00001.parquet", TEST)
    counts = prepare_gsm8k([src], tmp_path / "out")
    assert counts == {"train": 5, "test": 1}
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert rows == TRAIN  # shards in name order, the fields as published
    records, skipped = read_gsm8k(tmp_path / "out", "test")
    assert skipped == 0 and records[0].data["answer"] == "1234"


def test_a_bad_record_or_a_missing_train_split_fails_naming_it(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", TEST)
    with pytest.raises(InputError, match="no training split"):
        prepare_gsm8k([tmp_path / "test.jsonl"], tmp_path / "out")
    write_jsonl(tmp_path / "train.jsonl", [*TRAIN, {"question": "q", "answer": "no marker"}])
    with pytest.raises(BadRecordError, match=r"train\.jsonl:6: answer has no '#### <number>'"):
        prepare_gsm8k([tmp_path / "train.jsonl"], tmp_path / "out")
    assert not (tmp_path / "out" / "train.jsonl").exists()
    with pytest.raises(DataNotFoundError, match="absent does not exist"):
        prepare_gsm8k([tmp_path / "absent"], tmp_path / "out")


def test_the_command_writes_the_example_s_directory_and_refuses_in_one_line(tmp_path, capsys):
    write_jsonl(tmp_path / "dl" / "train.jsonl", TRAIN)
    write_jsonl(tmp_path / "dl" / "test.jsonl", TEST)
    assert main(["data", "gsm8k", "--from", str(tmp_path / "dl" / "train.jsonl"), str(tmp_path / "dl" / "test.jsonl"),
                 "--out", str(tmp_path / "gsm8k")]) == 0
    assert f"{tmp_path / 'gsm8k' / 'train.jsonl'}: 5 records" in capsys.readouterr().out
    assert main(["data", "gsm8k", "--from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {tmp_path / 'nowhere'} does not exist"]


def test_the_example_reads_what_the_command_writes():
    from m2flow.driver.registry import load_workflow_config

    _, cfg = load_workflow_config("examples/reasoning/gsm8k_grpo.yaml")
    parser_default = main.__globals__["build_parser"]().parse_args(["data", "gsm8k", "--from", "x"]).out
    assert cfg.data.kind == "gsm8k" and cfg.data.path == str(parser_default) == "data/gsm8k"
