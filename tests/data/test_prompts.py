"""Prompt datasets: keys, templates, chat templates, length filter, bad lines."""

from __future__ import annotations

import json

import pytest

from m2flow.data.prompts import PromptDataset, format_prompt
from m2flow.data.records import BadRecordError, write_jsonl, write_parquet
from m2flow.models.tokenizer import train_char_tokenizer

CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-*=:?. \n<>|_/"


@pytest.fixture(scope="module")
def tok():
    return train_char_tokenizer([CHARS])


ROWS = [{"q": "1+1=", "a": 2}, {"q": "2+3=", "a": "5"}, {"q": "10-4=", "a": "6"}]


def test_custom_keys_and_answers_as_strings(tmp_path, tok):
    ds = PromptDataset.from_file(write_jsonl(tmp_path / "d.jsonl", ROWS), tok, prompt_key="q", answer_key="a")
    assert [it.prompt for it in ds] == ["1+1=", "2+3=", "10-4="]
    assert [it.answer for it in ds] == ["2", "5", "6"]
    assert [it.index for it in ds] == [0, 1, 2]
    assert ds[1].prompt_ids == tok("2+3=")["input_ids"]
    assert ds[0].source.endswith("d.jsonl:1")


def test_jsonl_and_parquet_datasets_are_equal(tmp_path, tok):
    rows = [{"q": r["q"], "a": str(r["a"])} for r in ROWS]
    a = PromptDataset.from_file(write_jsonl(tmp_path / "d.jsonl", rows), tok, prompt_key="q", answer_key="a")
    b = PromptDataset.from_file(write_parquet(tmp_path / "d.parquet", rows), tok, prompt_key="q", answer_key="a")
    strip = lambda ds: [(it.prompt, it.prompt_ids, it.answer, it.extra) for it in ds]  # noqa: E731
    assert strip(a) == strip(b)


def test_prompt_template_and_simple_chat_format(tok):
    assert format_prompt("2+2=", prompt_template="Q: {prompt}") == "Q: 2+2="
    assert format_prompt("hi", tok, use_chat_template=True) == "User: hi\nAssistant:"
    assert format_prompt("hi", tok, use_chat_template=True, system_prompt="be brief") == (
        "System: be brief\nUser: hi\nAssistant:"
    )


def test_tokenizer_chat_template_is_used_when_present():
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    tok = train_char_tokenizer([CHARS], chat_template=template)
    text = format_prompt("hi", tok, use_chat_template=True, system_prompt="sys")
    assert text == "<system>sys<user>hi<assistant>"


def test_long_prompts_are_dropped_and_counted(tok):
    ds = PromptDataset.from_records([{"prompt": "1+1="}, {"prompt": "123456789+1="}], tok, answer_key=None, max_prompt_tokens=5)
    assert [it.prompt for it in ds] == ["1+1="]
    assert ds.num_too_long == 1
    assert ds[0].answer is None


def test_bad_lines_error_or_skip(tmp_path, tok):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps(ROWS[0]), json.dumps({"q": "", "a": 1}), "{bad", json.dumps({"q": "x"})]) + "\n")
    with pytest.raises(BadRecordError, match=r"d\.jsonl:3: invalid JSON"):
        PromptDataset.from_file(path, tok, prompt_key="q", answer_key="a")
    ds = PromptDataset.from_file(path, tok, prompt_key="q", answer_key="a", on_bad_line="skip")
    assert len(ds) == 1
    # line 2 (empty prompt), line 3 (bad JSON), line 4 (no answer)
    assert ds.num_skipped == 3
    path.write_text("\n".join([json.dumps(ROWS[0]), json.dumps({"q": " ", "a": 1})]) + "\n")
    with pytest.raises(BadRecordError, match=r"d\.jsonl:2: empty or missing prompt key 'q'"):
        PromptDataset.from_file(path, tok, prompt_key="q", answer_key="a")
