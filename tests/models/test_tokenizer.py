"""Offline tokenizers: round trips, special tokens, save/load from a local directory."""

from __future__ import annotations

import pytest

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET
from m2flow.models.tokenizer import SPECIAL_TOKENS, load_tokenizer, save_tokenizer, train_bpe_tokenizer, train_char_tokenizer, train_tokenizer

TEXTS = ["Janet has 16 eggs.", "She eats 3 and bakes 4.\nHow many are left?", "naïve café: 9 * 2 = 18"] * 20


def test_arithmetic_char_tokenizer_is_tiny_and_round_trips():
    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    assert len(tok) == len(SPECIAL_TOKENS) + len(set(ARITHMETIC_ALPHABET))
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = tok("12+7= 19", add_special_tokens=False)["input_ids"]
    assert len(ids) == 8  # one token per character, space included
    assert tok.decode(ids) == "12+7= 19"
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "12+7= 19"
    assert tok("x")["input_ids"] == [tok.unk_token_id]


def test_bpe_round_trips_any_text_and_merges():
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    for text in TEXTS[:3] + ["unseen ✓ text"]:
        assert tok.decode(tok(text)["input_ids"]) == text
    # Merges learned on the corpus make frequent words shorter than their bytes.
    assert len(tok("Janet has 16 eggs.")["input_ids"]) < len("Janet has 16 eggs.")
    with pytest.raises(ValueError, match="at least 260"):
        train_bpe_tokenizer(TEXTS, vocab_size=100)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_and_load_from_local_directory(tmp_path, kind):
    tok = train_tokenizer(TEXTS, kind=kind, vocab_size=300)
    save_tokenizer(tok, tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    text = "She eats 3 and bakes 4."
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.pad_token == "<pad>" and again.eos_token == "<eos>" and again.bos_token == "<bos>"
    assert again.padding_side == "left"


def test_load_refuses_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown tokenizer kind 'word'"):
        train_tokenizer(TEXTS, kind="word")  # type: ignore[arg-type]


def test_a_char_tokenizer_saved_beside_a_tiny_model_keeps_its_spaces(tmp_path):
    # Beside a model's config.json the model type's tokenizer class must not replace the one built here.
    from m2flow.models.tiny import TinyModelConfig, build_tiny_model, save_checkpoint

    tok = train_char_tokenizer(["abc 123:"])
    model = build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                             intermediate_size=32), tok)
    save_checkpoint(model, tok, tmp_path / "m")
    again = load_tokenizer(tmp_path / "m")
    assert again("a 1: b", add_special_tokens=False)["input_ids"] == tok("a 1: b", add_special_tokens=False)["input_ids"]
    save_checkpoint(model, again, tmp_path / "m2")  # saved again after loading (a warm start does)
    twice = load_tokenizer(tmp_path / "m2")
    assert twice.decode(twice("a 1: b", add_special_tokens=False)["input_ids"]) == "a 1: b"
    assert twice.padding_side == "left" and twice.eos_token == "<eos>"
