"""The agentic workflow with ``rollout.tool_format: hermes``: a tiny model whose tokenizer carries the project's
tool-aware chat template, the calculator's tool given as a function schema, calls and results in the template."""

from __future__ import annotations

import math
import string
from pathlib import Path

import pytest

from m2flow.autoplan.entry import train
from m2flow.models.chat_templates import TOOL_CHAT_TEMPLATE, template_characters
from m2flow.models.tiny import TinyModelConfig, build_tiny_model, save_checkpoint
from m2flow.models.tokenizer import train_char_tokenizer
from m2flow.rewards.tools.calculator import Calculator
from m2flow.rewards.tools.schema import function_schema
from m2flow.workflows.agentic.workflow import WORKFLOW
from tests.workflows.agentic.setup import tiny_config

HERMES = {"rollout.tool_format": "hermes", "rollout.stop": [], "rollout.max_turn_tokens": 120,
          "rollout.max_tokens": 300, "env.name": "calculator", "env.kwargs": {"digits": 2}, "env.eval_kwargs": {}}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """A tiny model whose character tokenizer carries the tool-aware chat template."""
    texts = [string.printable + template_characters([function_schema(Calculator())])]
    tokenizer = train_char_tokenizer(texts, chat_template=TOOL_CHAT_TEMPLATE)
    lm = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64,
                                          max_position_embeddings=1024), tokenizer)
    return save_checkpoint(lm, tokenizer, tmp_path_factory.mktemp("chat") / "model")


def test_a_scripted_caller_solves_every_episode_through_the_chat_template(tmp_path, chat_model):
    history = train(WORKFLOW, tiny_config(tmp_path, chat_model, steps=1, **HERMES, **{
        "model.create_tiny": False, "rollout.backend": "test_hermes_caller"})).history
    h = history[0]
    assert h["tool/ok"] == 4 and h["rollout/finish_terminated"] == 4 and h["reward/mean"] == 1.0
    assert h["rollout/turns_mean"] == 2 and h["rollout/observation_tokens"] > 0 and math.isfinite(h["actor/pg_loss"])


def test_a_tiny_model_trains_two_iterations_with_hermes_tools(tmp_path, chat_model):
    history = train(WORKFLOW, tiny_config(tmp_path, chat_model, steps=2, **HERMES, **{"model.create_tiny": False})).history
    assert len(history) == 2 and all(h["rollout/trajectories"] == 4 for h in history)
    assert all(math.isfinite(h["actor/pg_loss"]) and h["rollout/model_tokens"] > 0 for h in history)


def test_the_tag_call_end_is_refused_with_the_hermes_format(tmp_path):
    with pytest.raises(ValueError, match=r"rollout.stop: holds '</tool>'.*set stop: \[\]"):
        tiny_config(tmp_path, **{**HERMES, "rollout.stop": ["</tool>"]})
