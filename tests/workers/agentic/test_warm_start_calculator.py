"""A tiny model warm-started on the imperfect teacher's demonstrations emits well-formed calculator calls."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation.lean import LeanGenerationBackend
from m2flow.data.calculator_demos import CALCULATOR_ALPHABET, CalculatorTeacher, sft_pairs
from m2flow.envs.text import TextEnvBatch
from m2flow.models.sft import sft_steps
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.models.tokenizer import train_char_tokenizer
from m2flow.workers.agentic import EpisodeConfig, run_episodes


@pytest.mark.learning
@pytest.mark.slow
def test_after_a_short_warm_start_the_model_calls_the_tool_in_form_on_held_out_problems():
    torch.set_num_threads(1)
    tokenizer = train_char_tokenizer(CALCULATOR_ALPHABET)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2), tokenizer)
    demos = CalculatorTeacher(skip_rate=0.2, copy_error_rate=0.1).demonstrations(400 * 32)
    sft_steps(model, tokenizer, sft_pairs(demos), steps=400, lr=3e-3, batch_size=32, warmup_steps=50)
    envs = TextEnvBatch.from_registry("calculator", 32, env_kwargs={"split": "test"})
    trajs, stats = run_episodes(LeanGenerationBackend(model, tokenizer), tokenizer, envs, list(range(32)),
                                list(range(32)), EpisodeConfig(max_turns=3, max_tokens=96, temperature=0.0))
    assert stats.tool_outcomes["ok"] >= 30  # well-formed calls to the calculator, answered
    assert all(t.finish_reason == "terminated" for t in trajs)
    assert sum(t.num_turns == 2 for t in trajs) >= 30  # call, then answer
