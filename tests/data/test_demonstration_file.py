"""A JSONL file of your own demonstrations: read as the teachers' episodes; a bad file is one line naming it."""

from __future__ import annotations

import json

import pytest

from m2flow.config.errors import InputError
from m2flow.data.demonstration_file import read_demonstrations
from m2flow.data.teachers import Demonstration


def test_episodes_are_read_with_their_optional_fields_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"prompt": "Value of C?", "turns": ["[[LOOKUP: C]]", " C=7 ", "ANSWER: 7"]}) + "\n\n"
                    + json.dumps({"prompt": "Value of A?", "turns": ["ANSWER: 3"], "kind": "skip",
                                  "correct": False}) + "\n")
    assert read_demonstrations(path) == [
        Demonstration("Value of C?", ("[[LOOKUP: C]]", " C=7 ", "ANSWER: 7"), "file", True),
        Demonstration("Value of A?", ("ANSWER: 3",), "skip", False)]


@pytest.mark.parametrize("line, words", [
    ("{not json", "demos.jsonl:2: Expecting property name"),
    ('{"turns": ["a"]}', "demos.jsonl:2: missing field 'prompt'"),
    ('{"prompt": "p", "turns": ["a", "b"]}', "demos.jsonl:2: 'turns' must have an odd length"),
    ('{"prompt": "p", "turns": "a"}', "demos.jsonl:2: 'turns' must be a list of strings"),
    ('{"prompt": "p", "turns": ["a"], "answer": "x"}', "demos.jsonl:2: unknown field 'answer'"),
    ('["p", "a"]', "demos.jsonl:2: expected an object"),
])
def test_a_bad_line_is_one_error_naming_the_file_and_line(tmp_path, line, words):
    path = tmp_path / "demos.jsonl"
    path.write_text('{"prompt": "p", "turns": ["a"]}\n' + line + "\n")
    with pytest.raises(InputError, match=words) as error:
        read_demonstrations(path)
    assert "\n" not in str(error.value)


def test_a_missing_or_empty_file_is_one_error_naming_it(tmp_path):
    with pytest.raises(InputError, match="cannot read .*nowhere.jsonl"):
        read_demonstrations(tmp_path / "nowhere.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InputError, match="empty.jsonl: no demonstrations"):
        read_demonstrations(tmp_path / "empty.jsonl")
