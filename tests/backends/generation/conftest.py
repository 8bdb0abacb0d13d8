"""A tiny checkpoint and a tiny model taught one answer ("12+7=" -> "19"), shared by generation tests."""

from __future__ import annotations

import pytest
import torch

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET
from m2flow.models.sft import sft_steps
from m2flow.models.tiny import TinyModelConfig, build_tiny_model, make_tiny_checkpoint
from m2flow.models.tokenizer import train_char_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tok():
    return train_char_tokenizer([ARITHMETIC_ALPHABET])


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory, tok):
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64)
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), tok, cfg)


@pytest.fixture(scope="session")
def taught(tok):
    """A model that answers '19<eos>' to '12+7=' under greedy decoding."""
    model = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, seed=1), tok)
    sft_steps(model, tok, [("12+7=", "19"), ("3+4=", "7")], steps=80, lr=1e-2, batch_size=2)
    return model
