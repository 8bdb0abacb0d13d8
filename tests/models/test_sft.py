"""The supervised warm start lowers the loss on the arithmetic task."""

from __future__ import annotations

import pytest
import torch

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET, ArithmeticTask
from m2flow.models.sft import sft_steps
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.models.tokenizer import train_char_tokenizer

torch.set_num_threads(1)


@pytest.mark.learning
def test_loss_drops_on_arithmetic():
    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    model = build_tiny_model(TinyModelConfig(hidden_size=64, intermediate_size=128, seed=0), tok)
    examples = ArithmeticTask(digits=1, operators=("+",)).sample("train", 80, seed=0)
    losses = sft_steps(model, tok, examples, steps=60, lr=3e-3, batch_size=32, seed=0)
    assert len(losses) == 60
    start, end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # Uniform guessing over the 19-token vocabulary costs ln 19 = 2.94 nats; the model must do much better.
    assert start > 2.0
    assert end < 0.6 * start
    assert not model.training


def test_warmup_ramps_the_learning_rate_and_each_step_is_reported():
    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    examples = ArithmeticTask(digits=1, operators=("+",)).sample("train", 40, seed=0)
    seen: list[tuple[int, float]] = []
    before = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, seed=0), tok)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, seed=0), tok)
    losses = sft_steps(model, tok, examples, steps=1, lr=1e-2, batch_size=8, warmup_steps=1000,
                       on_step=lambda step, loss: seen.append((step, loss)))
    assert seen == [(1, losses[0])]
    # The first step runs at lr / 1000: the weights barely move.
    moved = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), before.parameters()))
    assert 0 < moved < 1e-3, moved
