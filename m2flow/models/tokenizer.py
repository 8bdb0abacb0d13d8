"""Tokenizers trained offline (character-level or small byte-level BPE), saved and loaded from local directories."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK)
"""Special tokens every tokenizer built here has, with ids 0, 1, 2, 3 in this order."""

TokenizerKind = Literal["char", "bpe"]


def _wrap(tok: Tokenizer, chat_template: str | None) -> PreTrainedTokenizerFast:
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        # Generation appends to the right, so batched prompts are padded on the left.
        padding_side="left",
    )
    if chat_template is not None:
        hf.chat_template = chat_template
    return hf


def train_char_tokenizer(texts: Iterable[str], chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """One token per distinct character of `texts` (sorted), after the special tokens; unknown chars -> <unk>."""
    chars = sorted(set("".join(texts)))
    if not chars:
        raise ValueError("cannot build a character tokenizer from empty texts")
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Every character is its own piece, whitespace and newlines included.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _wrap(tok, chat_template)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 512,
    min_frequency: int = 2,
    chat_template: str | None = None,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `texts` (any text round-trips); vocab_size counts the 256 byte tokens."""
    floor = 256 + len(SPECIAL_TOKENS)
    if vocab_size < floor:
        raise ValueError(f"vocab_size must be at least {floor} for a byte-level BPE, got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok, chat_template)


def train_tokenizer(
    texts: Iterable[str],
    kind: TokenizerKind = "char",
    vocab_size: int = 512,
    chat_template: str | None = None,
) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `kind` ('char' or 'bpe') on `texts`."""
    if kind == "char":
        return train_char_tokenizer(texts, chat_template=chat_template)
    if kind == "bpe":
        return train_bpe_tokenizer(texts, vocab_size=vocab_size, chat_template=chat_template)
    raise ValueError(f"unknown tokenizer kind {kind!r}; valid: ['char', 'bpe']")


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write the tokenizer files into directory `path` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    return path


def load_tokenizer(path: str | Path, **kwargs: Any) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local directory only (never from a hub); fails if the directory is missing."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    if _built_here(path):
        # Beside a model's config.json, AutoTokenizer takes the model type's tokenizer class (Qwen2's
        # byte-level BPE for a tiny Qwen2) and rebuilds ours as one: every space is then dropped.
        # A tokenizer built here is exactly its tokenizer.json.
        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True, **kwargs)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, **kwargs)


GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
"""``tokenizer_class`` of a tokenizer saved from a bare ``tokenizers`` object (the ones built here)."""


def _built_here(path: Path) -> bool:
    """Whether the directory's tokenizer is a generic one (a tokenizer.json and no class of its own)."""
    import json

    config = path / "tokenizer_config.json"
    if not (path / "tokenizer.json").is_file() or not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("tokenizer_class") in GENERIC_CLASSES
    except (OSError, ValueError):
        return False  # AutoTokenizer says what is wrong with the file
