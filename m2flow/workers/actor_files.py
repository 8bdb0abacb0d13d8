"""The reasoning actor's checkpoint files: where its parts sit in a checkpoint directory, whether they are
per-rank shards, a whole Hugging Face model put together from shards, and a value model written as
``CausalLMWithValueHead.from_pretrained`` reads it. Code that only reads checkpoints imports these
without the actor worker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ACTOR_DIR = "actor"
CRITIC_DIR = "critic"
SHARDS = "shards"  # a sharded strategy's per-rank checkpoint files (torch.distributed.checkpoint)


def is_sharded(checkpoint: Path) -> bool:
    """Whether the actor checkpoint in ``checkpoint`` holds per-rank shards rather than whole weights."""
    return (checkpoint / ACTOR_DIR / SHARDS).is_dir()


def whole_model_dir(actor_dir: Path, out: Path) -> Path:
    """A Hugging Face model directory at ``out`` from a sharded actor checkpoint ``actor_dir`` (its config and
    tokenizer, the shards put together in this process); returns ``out``."""
    import shutil

    from safetensors.torch import save_file

    from m2flow.backends.training import sharded_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    for f in actor_dir.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    weights = sharded_checkpoint.load_full(actor_dir / SHARDS, "model")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def save_value_model(model: Any, weights: dict[str, torch.Tensor], path: Path) -> None:
    """A value model as ``CausalLMWithValueHead.from_pretrained`` reads it: trunk + value head file."""
    from safetensors.torch import save_file

    from m2flow.models.causal_lm import VALUE_HEAD_FILE

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix):]: v.contiguous() for k, v in weights.items() if k.startswith(prefix)}

    model.trunk.save_pretrained(str(path), state_dict=part("trunk."))
    save_file(part("value_head."), str(path / VALUE_HEAD_FILE))
