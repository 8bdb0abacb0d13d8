"""Causal LMs from local paths: response log-probs and entropy in micro-batches, and a value-head critic.

Layout used throughout (see `m2flow.data.batch`): prompts left-padded (B, Lp), responses right-padded
(B, Lr). The logits at position Lp - 1 + t predict response token t, so per-token outputs come back as
(B, Lr), zero on padding.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

from m2flow.models.response_forward import (
    HFResponseForward,
    ResponseForward,
    position_ids_from_mask,
    trim_span,
)
from m2flow.models.tokenizer import load_tokenizer
from m2flow.models.weight_files import check_safetensors, readable_weights

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
_HF_FORWARD = HFResponseForward()


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
    check_safetensors(path)
    with readable_weights(path):
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    return model.to(device).eval()


def load_model_and_tokenizer(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, Any]:
    """Model and tokenizer stored in the same local directory."""
    return load_causal_lm(path, dtype=dtype, device=device), load_tokenizer(path)


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
    forward: ResponseForward | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, Lr) of the responses, and their entropy (B, Lr) if asked; 0 on padding.

    Inputs are prompt ids/mask (B, Lp) left-padded and response ids/mask (B, Lr) right-padded.
    Runs in micro-batches of `micro_batch_size` rows (all at once when None). Gradients flow when
    the caller has them enabled; wrap in `torch.no_grad()` for inference. The logits come from
    `forward` (`m2flow.models.response_forward`; None: the model's own forward, `HFResponseForward`).
    """
    b, lr_full = response_ids.shape
    mbs = micro_batch_size or b
    forward = _HF_FORWARD if forward is None else forward
    logps, ents = [], []
    for i in range(0, b, mbs):
        sl = slice(i, i + mbs)
        span = trim_span(prompt_ids[sl], prompt_mask[sl], response_ids[sl], response_mask[sl])
        logits = forward.logits(model, prompt_ids[sl], prompt_mask[sl], span)  # (mb, lr, V)
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
        check_safetensors(path)
        with readable_weights(path):
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
            span = trim_span(prompt_ids[sl], prompt_mask[sl], response_ids[sl], response_mask[sl])
            values = self(span.input_ids, span.attention_mask)[:, -span.lr - 1 : -1]
            out.append(_pad_to(values * span.response_mask.to(values.dtype), lr_full))
        return torch.cat(out, 0)
