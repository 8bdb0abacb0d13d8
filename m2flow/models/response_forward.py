"""The forward that turns a micro-batch of prompts + responses into the logits predicting each response token.

`response_logprobs` (`causal_lm.py`) asks a `ResponseForward` for these logits and takes log-probs and
entropy from them; which forward runs is chosen once, by name from the config, through
`create_response_forward`:

* ``hf``: the HF model's own forward over the rows `cat(prompt, response)` (any causal LM, any wrapper);
* ``packed``: `m2flow.models.packed_forward.packed_logits` over the model's live parameters (Qwen2/Llama
  only, the bare model, not a DDP/FSDP wrapper): the same values to float rounding, with each distinct
  prompt run once, no padding inside a group and less per-pass overhead on small models.

Layout (see `m2flow.data.batch`): prompts left-padded (B, Lp), responses right-padded (B, Lr).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from m2flow.models.functional_layers import check_supported
from m2flow.models.packed_forward import packed_logits

__all__ = [
    "RESPONSE_FORWARDS",
    "HFResponseForward",
    "PackedResponseForward",
    "ResponseForward",
    "ResponseSpan",
    "create_response_forward",
    "position_ids_from_mask",
    "trim_span",
]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counting only real tokens, so left padding does not shift positions."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class ResponseSpan:
    """A micro-batch with all-padding columns cut off; `lr` is the kept response width."""

    input_ids: torch.Tensor
    """(B, Lp' + lr) the kept prompt columns, then the kept response columns."""
    attention_mask: torch.Tensor
    """(B, Lp' + lr) 1 on real tokens."""
    response_ids: torch.Tensor
    """(B, lr)"""
    response_mask: torch.Tensor
    """(B, lr)"""
    lr: int


def trim_span(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
              response_mask: torch.Tensor) -> ResponseSpan:
    """Drop prompt columns that are padding in every row and response columns past the longest response."""
    if (prompt_mask.sum(-1) == 0).any():
        raise ValueError("every row needs at least one prompt token")
    start = int(prompt_mask.any(0).long().argmax())
    has_tok = response_mask.any(0).nonzero()
    lr = int(has_tok[-1]) + 1 if len(has_tok) else 1
    r_ids, r_mask = response_ids[:, :lr], response_mask[:, :lr]
    return ResponseSpan(
        input_ids=torch.cat([prompt_ids[:, start:], r_ids], dim=1),
        attention_mask=torch.cat([prompt_mask[:, start:], r_mask], dim=1),
        response_ids=r_ids,
        response_mask=r_mask,
        lr=lr,
    )


@runtime_checkable
class ResponseForward(Protocol):
    """Logits predicting each response token of a micro-batch; knows nothing about losses or log-probs."""

    name: str
    """The config name this forward is chosen by (`actor.forward`, `inference.forward`)."""

    def check(self, model: nn.Module) -> None:
        """Raise ValueError naming what this forward cannot run in `model` (called once, at start-up)."""
        ...

    def logits(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               span: ResponseSpan) -> torch.Tensor:
        """Logits (B, lr, V): entry (r, t) predicts `span.response_ids[r, t]`; prompt ids/mask (B, Lp)
        untrimmed, `span` their `trim_span`. Entries at response padding are unspecified: mask them."""
        ...


class HFResponseForward:
    """The model's own forward; only the last lr + 1 positions' logits are computed."""

    name = "hf"

    def check(self, model: nn.Module) -> None:
        """Any causal LM runs."""

    def logits(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               span: ResponseSpan) -> torch.Tensor:
        positions = position_ids_from_mask(span.attention_mask)
        out = model(input_ids=span.input_ids, attention_mask=span.attention_mask, position_ids=positions,
                    use_cache=False, logits_to_keep=span.lr + 1)
        return out.logits[:, -span.lr - 1 : -1]  # (B, lr, V)


class PackedResponseForward:
    """`packed_logits`: each prompt once per micro-batch, no padding inside a group (Qwen2/Llama, bare model)."""

    name = "packed"

    def check(self, model: nn.Module) -> None:
        check_supported(model.config)

    def logits(self, model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               span: ResponseSpan) -> torch.Tensor:
        return packed_logits(model, prompt_ids, prompt_mask, span.response_ids, span.response_mask)


RESPONSE_FORWARDS: dict[str, type] = {"hf": HFResponseForward, "packed": PackedResponseForward}
"""Config name -> forward class."""

_RENAMED = {"lean": "packed"}


def create_response_forward(name: str) -> ResponseForward:
    """The forward registered as `name`; an unknown name lists the valid ones."""
    if name in _RENAMED:
        raise ValueError(f"response forward {name!r} is now called {_RENAMED[name]!r}")
    if name not in RESPONSE_FORWARDS:
        raise ValueError(f"unknown response forward {name!r}; valid: {sorted(RESPONSE_FORWARDS)}")
    return RESPONSE_FORWARDS[name]()
