"""The tokenizer of an agentic run's tiny model: one that can write every character the task uses.

``char`` (``model.tiny.tokenizer``): a token per character. The shipped environments, taught by their own
teachers, keep the alphabet they always had (``SHIPPED_ALPHABET``: their tests and figures were measured on
it, and a vocabulary of another size initialises other weights). Any other task gets every printable ASCII
character (brackets, capitals, punctuation) and every character of its text: the first observations of a
few episodes of the environment (training and held-out settings), the rollout's templates and stop strings,
and the demonstrations of the warm start. ``byte``: a token per byte, so any text round-trips, whatever
its language.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from m2flow.data.calculator_demos import CALCULATOR_ALPHABET
from m2flow.data.teachers import Demonstration
from m2flow.workflows.agentic.config import AgenticConfig

SHIPPED_ALPHABET = "".join(CALCULATOR_ALPHABET) + "?.,!"
"""The shipped environments' characters: the calculator's alphabet and the guessing game's punctuation."""
SHIPPED = ("calculator", "guess_number")
"""Environments whose teachers ship with m2flow and whose tiny models use ``SHIPPED_ALPHABET`` alone."""
RESET_SAMPLES = 16
"""Episodes of the environment whose first observation the alphabet covers."""
BYTE_VOCAB = 256
"""A byte-level BPE's 256 byte tokens: asked for no more, it learns no merges (one token per byte)."""


def uses_shipped_alphabet(cfg: AgenticConfig) -> bool:
    """Whether the task is a shipped environment taught by its own teacher (no file, no other teacher)."""
    ws = cfg.model.warm_start
    return cfg.env.name in SHIPPED and ws.demonstrations is None and ws.teacher in (None, cfg.env.name)


def env_texts(cfg: AgenticConfig, samples: int = RESET_SAMPLES) -> list[str]:
    """The first observation of ``samples`` episodes under the training and the held-out settings."""
    from m2flow.envs.text import make_text_env

    texts = []
    for kwargs in (cfg.env.kwargs, {**cfg.env.kwargs, **cfg.env.eval_kwargs}):
        env: Any = make_text_env(cfg.env.name, **kwargs)
        texts += [str(env.reset(seed=seed)[0]) for seed in range(samples)]
        close = getattr(env, "close", None)
        if callable(close):
            close()
    return texts


def task_texts(cfg: AgenticConfig, demos: Sequence[Demonstration]) -> list[str]:
    """Every text whose characters the tokenizer must have: printable ASCII, the environment's first
    observations, the rollout's templates and stop strings, and ``demos``."""
    r = cfg.rollout
    texts = [SHIPPED_ALPHABET, string.printable, r.prompt_template, r.observation_template, *r.stop]
    texts += env_texts(cfg)
    for d in demos:
        texts += [d.prompt, *d.turns]
    return texts


def build_tokenizer(kind: str, texts: Sequence[str]) -> Any:
    """A ``kind`` ('char' or 'byte') tokenizer covering ``texts``."""
    from m2flow.models.tokenizer import SPECIAL_TOKENS, train_bpe_tokenizer, train_char_tokenizer

    if kind == "char":
        return train_char_tokenizer(texts)
    if kind == "byte":
        return train_bpe_tokenizer(texts, vocab_size=BYTE_VOCAB + len(SPECIAL_TOKENS))
    raise ValueError(f"unknown tokenizer {kind!r}; valid: char, byte")
