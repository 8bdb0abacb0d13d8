"""Tiny random causal LMs (Qwen2, Llama architectures) built from configs and saved as local checkpoints."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from m2flow.models.rng import seeded

logger = logging.getLogger(__name__)

ARCHITECTURES: dict[str, tuple[type, type]] = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}
"""Architecture name -> (config class, causal LM class)."""


@dataclass
class TinyModelConfig:
    """Shape of a tiny decoder-only model; the defaults make a ~0.1M-parameter 2-layer model."""

    arch: str = "qwen2"
    """Architecture: one of ARCHITECTURES ('qwen2', 'llama')."""
    vocab_size: int | None = None
    """Vocabulary size; None takes it from the tokenizer."""
    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention when smaller than num_heads)."""
    intermediate_size: int = 128
    """Width of the MLP."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the model is meant for."""
    tie_word_embeddings: bool = True
    """Share input embedding and output projection (saves parameters in tiny models)."""
    seed: int = 0
    """Seed of the random initialization."""


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase | None = None) -> PreTrainedModel:
    """A randomly initialized causal LM; special token ids and vocab size come from `tokenizer` when given."""
    if cfg.arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {cfg.arch!r}; valid: {sorted(ARCHITECTURES)}")
    config_cls, model_cls = ARCHITECTURES[cfg.arch]
    vocab_size = cfg.vocab_size if cfg.vocab_size is not None else (len(tokenizer) if tokenizer is not None else None)
    if vocab_size is None:
        raise ValueError("vocab_size is needed when no tokenizer is given")
    special: dict[str, Any] = {}
    if tokenizer is not None:
        special = {
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
        }
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        **special,
    )
    # Seed locally so building a model does not disturb the caller's random stream (nor another
    # thread's: ``seeded`` holds the process's global generator for the block).
    with seeded(cfg.seed):
        model = model_cls(config)
    if tokenizer is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path
) -> Path:
    """Save model (safetensors) and tokenizer into one directory loadable with `from_pretrained(path)`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))  # safetensors is the only format written
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


def make_tiny_checkpoint(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None
) -> Path:
    """Build a tiny random model for `tokenizer` and save both to `path`; returns the path."""
    model = build_tiny_model(cfg or TinyModelConfig(), tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("saving a tiny %s model with %d parameters to %s", model.config.model_type, n_params, path)
    return save_checkpoint(model, tokenizer, path)
