import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2flow.config import ConfigError
from m2flow.config.yaml_io import dump_inline, dump_yaml, parse_yaml, read_yaml


def test_yaml_1_2_scalars():
    data = parse_yaml(
        "a: yes\nb: no\nc: on\nd: off\ne: true\nf: False\ng: 010\nh: 1e-3\n"
        "i: 2024-01-01\nj: 1_000\nk: 0x10\nl: .inf\nm: ~\nn:\no: 1.0e+16\n"
    )
    assert data == {
        "a": "yes", "b": "no", "c": "on", "d": "off", "e": True, "f": False, "g": 10,
        "h": 0.001, "i": "2024-01-01", "j": 1000, "k": 16, "l": math.inf, "m": None,
        "n": None, "o": 1e16,
    }


def test_merge_key_still_works():
    data = parse_yaml("base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n")
    assert data["derived"] == {"x": 1, "y": 3}


def test_duplicate_key_is_an_error_with_its_line():
    with pytest.raises(ConfigError, match=r"duplicate key 'lr' \(line 3, column 3\)"):
        parse_yaml("optim:\n  lr: 1\n  lr: 2\n", source="x.yaml")


def test_syntax_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("a: [1, 2\nb: 3\n")
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert str(path) in str(info.value)
    assert "invalid YAML" in str(info.value) and "line" in str(info.value)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        read_yaml(tmp_path / "nope.yaml")


def test_directory_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        read_yaml(tmp_path)


def test_dump_inline():
    assert dump_inline([1, "a"]) == "[1, a]"
    assert dump_inline(None) == "null"
    assert dump_inline("yes") == "'yes'"
    assert dump_inline("a...") == "a..."


# PyYAML mangles the rare Unicode line breaks (U+0085, U+2028...) inside quoted scalars; plain
# control characters other than newline and tab are not config material either.
text = st.text(
    st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp"), include_characters="\n\t"),
    max_size=20,
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), text)
trees = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(text, trees, max_size=4))
def test_dump_then_parse_is_identity(data):
    assert parse_yaml(dump_yaml(data)) == data
