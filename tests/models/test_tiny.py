"""Tiny random models: built from configs, saved locally, reloaded with identical outputs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET
from m2flow.models.tiny import TinyModelConfig, build_tiny_model, make_tiny_checkpoint
from m2flow.models.tokenizer import train_char_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return train_char_tokenizer([ARITHMETIC_ALPHABET])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_save_load_gives_equal_outputs(tmp_path, tok, arch):
    cfg = TinyModelConfig(arch=arch, hidden_size=32, intermediate_size=64, seed=3)
    path = make_tiny_checkpoint(tmp_path / arch, tok, cfg)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    model = build_tiny_model(cfg, tok)
    loaded = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()
    loaded_tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert loaded.config.model_type == arch
    assert loaded.config.vocab_size == len(tok) == len(loaded_tok)
    assert loaded.config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([loaded_tok("12+7=")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_seed_controls_initialization(tok):
    a = build_tiny_model(TinyModelConfig(seed=0), tok)
    b = build_tiny_model(TinyModelConfig(seed=0), tok)
    c = build_tiny_model(TinyModelConfig(seed=1), tok)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_shape_follows_config(tok):
    m = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2), tok)
    assert len(m.model.layers) == 2 and m.config.hidden_size == 64 and m.config.num_key_value_heads == 2
    with pytest.raises(ValueError, match=r"unknown architecture 'gpt9'; valid: \['llama', 'qwen2'\]"):
        build_tiny_model(TinyModelConfig(arch="gpt9"), tok)
    with pytest.raises(ValueError, match="vocab_size is needed"):
        build_tiny_model(TinyModelConfig())
