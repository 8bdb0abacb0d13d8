"""A tiny character-level checkpoint shared by the worker tests."""

from __future__ import annotations

import pytest
import torch

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET
from m2flow.models.tiny import TinyModelConfig, make_tiny_checkpoint
from m2flow.models.tokenizer import train_char_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64, seed=3)
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-workers"), tok, cfg))
