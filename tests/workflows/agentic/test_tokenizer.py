"""The tiny agentic model's tokenizer: the shipped environments keep their alphabet; any other task's text,
brackets, capitals, punctuation and (byte-level) any language, round-trips exactly."""

from __future__ import annotations

import pytest

from m2flow.data.teachers import Demonstration
from m2flow.models.tokenizer import load_tokenizer
from m2flow.workflows.agentic.tokenizer import SHIPPED_ALPHABET, build_tokenizer, task_texts, uses_shipped_alphabet
from m2flow.workflows.agentic.warm_start import prepare_task_model
from tests.workflows.agentic.setup import tiny_config

TEXTS = ["[[LOOKUP: Key]] then ANSWER: 7", "Q: {a, b}; (x|y) ~ `z` \\ ^_^ @#$%&*!?", "line\n\ttab  two spaces"]
NON_ASCII = "héllo wörld, naïve café ✓ 日本語"


def round_trips(tokenizer, text: str) -> bool:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text


def test_the_shipped_environments_keep_their_alphabet(tmp_path):
    cfg = tiny_config(tmp_path)
    assert uses_shipped_alphabet(cfg)
    tokenizer = load_tokenizer(prepare_task_model(cfg))
    assert len(tokenizer) == 4 + len(SHIPPED_ALPHABET)  # the special tokens, then the same characters as before


def test_a_task_of_your_own_gets_printable_ascii_and_its_own_characters(tmp_path):
    # test_faulty is guess-the-number under another name: not a shipped teacher's task, so the superset.
    cfg = tiny_config(tmp_path, **{"env.name": "test_faulty"})
    assert not uses_shipped_alphabet(cfg)
    texts = task_texts(cfg, [Demonstration("Prix ?", ("ÉTÉ",), "file", True)])
    tokenizer = build_tokenizer("char", texts)
    assert all(round_trips(tokenizer, t) for t in [*TEXTS, "guess 1-8:", "Prix ? ÉTÉ"])
    assert not round_trips(tokenizer, NON_ASCII)  # characters the task never showed are <unk> for a char tokenizer
    built = load_tokenizer(prepare_task_model(cfg))  # saved and loaded back with the model
    assert all(round_trips(built, t) for t in TEXTS)


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_brackets_capitals_punctuation_round_trip_and_bytes_take_any_text(tmp_path, kind):
    cfg = tiny_config(tmp_path, **{"env.name": "test_faulty", "model.tiny.tokenizer": kind})
    tokenizer = load_tokenizer(prepare_task_model(cfg))
    assert all(round_trips(tokenizer, t) for t in TEXTS)
    if kind == "byte":
        assert len(tokenizer) == 4 + 256
        assert round_trips(tokenizer, NON_ASCII)
