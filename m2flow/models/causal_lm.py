"""Causal LMs from local paths: response log-probs and entropy in micro-batches, and a value-head critic.

Layout used throughout (see `m2flow.data.batch`): prompts left-padded (B, Lp), responses right-padded
(B, Lr). The logits at position Lp - 1 + t predict response token t, so per-token outputs come back as
(B, Lr), zero on padding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

from m2flow.models.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"


def _check_local(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path} (models are only loaded from local paths)")
    return path


def load_causal_lm(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Load `AutoModelForCausalLM` from a local directory, never downloading; returned in eval mode."""
    path = _check_local(path)
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    return model.to(device).eval()


def load_model_and_tokenizer(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, Any]:
    """Model and tokenizer stored in the same local directory."""
    return load_causal_lm(path, dtype=dtype, device=device), load_tokenizer(path)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counting only real tokens, so left padding does not shift positions."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at labels: (B, L, V), (B, L) -> (B, L)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # logsumexp + gather avoids materializing a second (B, L, V) tensor of log-probs.
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature): (B, L, V) -> (B, L)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass
class _Span:
    """A micro-batch with all-padding columns cut off; `lr` is the kept response width."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    lr: int


def _trim(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor, response_mask: torch.Tensor) -> _Span:
    """Drop prompt columns that are padding in every row and response columns past the longest response."""
    if (prompt_mask.sum(-1) == 0).any():
        raise ValueError("every row needs at least one prompt token")
    start = int(prompt_mask.any(0).long().argmax())
    has_tok = response_mask.any(0).nonzero()
    lr = int(has_tok[-1]) + 1 if len(has_tok) else 1
    r_ids, r_mask = response_ids[:, :lr], response_mask[:, :lr]
    return _Span(
        input_ids=torch.cat([prompt_ids[:, start:], r_ids], dim=1),
        attention_mask=torch.cat([prompt_mask[:, start:], r_mask], dim=1),
        response_ids=r_ids,
        response_mask=r_mask,
        lr=lr,
    )


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def response_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    return_entropy: bool = False,
    lean: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, Lr) of the responses, and their entropy (B, Lr) if asked; 0 on padding.

    Inputs are prompt ids/mask (B, Lp) left-padded and response ids/mask (B, Lr) right-padded.
    Runs in micro-batches of `micro_batch_size` rows (all at once when None). Gradients flow when
    the caller has them enabled; wrap in `torch.no_grad()` for inference. With `lean` the logits come
    from `m2flow.models.lean_packed.lean_packed_logits` over the model's own parameters (Qwen2/Llama;
    the same values, with each distinct prompt run once, no padding inside a group and less per-pass
    overhead) instead of the model's forward.
    """
    b, lr_full = response_ids.shape
    mbs = micro_batch_size or b
    logps, ents = [], []
    for i in range(0, b, mbs):
        sl = slice(i, i + mbs)
        span = _trim(prompt_ids[sl], prompt_mask[sl], response_ids[sl], response_mask[sl])
        if lean:
            from m2flow.models.lean_packed import lean_packed_logits

            logits = lean_packed_logits(model, prompt_ids[sl], prompt_mask[sl], span.response_ids, span.response_mask)
        else:  # only the last lr + 1 positions' logits are needed: the ones predicting response tokens
            positions = position_ids_from_mask(span.attention_mask)
            logits = model(input_ids=span.input_ids, attention_mask=span.attention_mask, position_ids=positions,
                           use_cache=False, logits_to_keep=span.lr + 1).logits[:, -span.lr - 1 : -1]  # (mb, lr, V)
        mask = span.response_mask.to(logits.dtype if logits.is_floating_point() else torch.float32)
        lp = logprobs_from_logits(logits, span.response_ids, temperature) * mask
        logps.append(_pad_to(lp, lr_full))
        if return_entropy:
            ents.append(_pad_to(entropy_from_logits(logits, temperature) * mask, lr_full))
    return torch.cat(logps, 0), (torch.cat(ents, 0) if return_entropy else None)


class CausalLMWithValueHead(nn.Module):
    """A critic: the transformer trunk of a causal LM (no LM head) and a linear head giving one value per token."""

    def __init__(self, trunk: PreTrainedModel) -> None:
        super().__init__()
        self.trunk = trunk
        hidden = trunk.config.hidden_size
        self.value_head = nn.Linear(hidden, 1)
        # Small initial values keep early advantages close to the rewards themselves.
        nn.init.normal_(self.value_head.weight, std=1.0 / (hidden + 1))
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> CausalLMWithValueHead:
        """Trunk from a local causal LM checkpoint; the value head too if `value_head.safetensors` is there."""
        path = _check_local(path)
        trunk = AutoModel.from_pretrained(str(path), local_files_only=True, dtype=dtype)
        model = cls(trunk).to(dtype)
        head = path / VALUE_HEAD_FILE
        if head.is_file():
            model.value_head.load_state_dict(load_file(str(head)))
        return model

    def save_pretrained(self, path: str | Path) -> Path:
        """Write the trunk (safetensors + config) and the value head into directory `path`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.trunk.save_pretrained(str(path))
        save_file({k: v.contiguous() for k, v in self.value_head.state_dict().items()}, str(path / VALUE_HEAD_FILE))
        return path

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values (B, L) for every position of input_ids (B, L)."""
        hidden = self.trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state
        return self.value_head(hidden).squeeze(-1)

    def response_values(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        micro_batch_size: int | None = None,
    ) -> torch.Tensor:
        """Values (B, Lr): entry t is the value of the state before response token t (0 on padding)."""
        b, lr_full = response_ids.shape
        mbs = micro_batch_size or b
        out = []
        for i in range(0, b, mbs):
            sl = slice(i, i + mbs)
            span = _trim(prompt_ids[sl], prompt_mask[sl], response_ids[sl], response_mask[sl])
            values = self(span.input_ids, span.attention_mask)[:, -span.lr - 1 : -1]
            out.append(_pad_to(values * span.response_mask.to(values.dtype), lr_full))
        return torch.cat(out, 0)
