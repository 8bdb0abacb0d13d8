"""Messages of the reasoning workflow: generated responses, their groups, and padded rollout batches.

Shapes: B = number of responses in a batch (prompts x n), Lp = longest prompt, Lr = longest response.
Prompts are left-padded (so generation appends at one column for every row), responses right-padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Literal

import torch

FinishReason = Literal["stop", "length"]
"""'stop': ended with the end-of-sequence token or a stop string; 'length': hit max_new_tokens."""


@dataclass
class Response:
    """One sampled continuation of a prompt."""

    token_ids: list[int]
    """Sampled token ids, including the end-of-sequence token or the tokens completing a stop string."""
    logprobs: list[float]
    """Log-probability of each sampled token under the policy (see the generation backend for which)."""
    finish_reason: FinishReason
    """Why generation ended."""
    text: str | None = None
    """Decoded text, cut before the stop string and without special tokens."""
    versions: list[int] | None = None
    """The weight version each token was sampled with (continuous batching records it; weights may change
    while a response is in flight); None: not recorded."""


@dataclass
class ResponseGroup:
    """The n responses sampled for one prompt; the unit that generation emits as soon as it is done."""

    prompt_index: int
    """Position of the prompt in the list given to `generate`."""
    prompt_ids: list[int]
    """Token ids of the prompt (unpadded)."""
    responses: list[Response]
    """The n responses, in sampling order."""


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack id lists right-aligned: ids (N, W) filled with pad_id on the left, mask (N, W) 1 on real tokens."""
    rows = [r.tolist() if isinstance(r, torch.Tensor) else list(r) for r in rows]
    width = max((len(r) for r in rows), default=0) if width is None else width
    # One tensor from padded lists: a slice assignment per row costs more than the whole copy.
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], dtype=torch.long).view(len(rows), width)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long).view(len(rows), width)
    return ids, mask


def right_pad(rows: Sequence[Sequence[float]], pad: float, width: int | None = None, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Stack lists left-aligned: (N, W) filled with `pad` on the right."""
    rows = [r.tolist() if isinstance(r, torch.Tensor) else list(r) for r in rows]
    width = max((len(r) for r in rows), default=0) if width is None else width
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=dtype).view(len(rows), width)


# How each optional (B, Lr) / (B,) field is padded when batches of different lengths are joined.
_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")
_RESPONSE_FIELDS = (
    "response_ids", "response_mask", "action_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs",
    "values", "advantages", "returns", "token_versions",
)


@dataclass
class RolloutBatch:
    """A padded batch of responses with everything the actor needs; optional fields are filled along the way."""

    prompt_ids: torch.Tensor
    """(B, Lp) long, left-padded with `pad_id`."""
    prompt_mask: torch.Tensor
    """(B, Lp) long, 1 on real prompt tokens."""
    response_ids: torch.Tensor
    """(B, Lr) long, right-padded with `pad_id`."""
    response_mask: torch.Tensor
    """(B, Lr) long, 1 on real response tokens."""
    group_ids: torch.Tensor
    """(B,) long; responses to the same prompt share an id (for group-relative advantages)."""
    truncated: torch.Tensor
    """(B,) bool; True where generation hit max_new_tokens."""
    pad_id: int = 0
    """Token id used for padding ids."""
    action_mask: torch.Tensor | None = None
    """(B, Lr) long, 1 on the response tokens the policy generated; None: all of `response_mask`. In
    multi-turn rollouts the response holds observation and tool tokens too: they are attended to
    (`response_mask`) but carry no loss (0 here)."""
    rewards: torch.Tensor | None = None
    """(B,) float, one scalar reward per response."""
    versions: torch.Tensor | None = None
    """(B,) long, the policy version (iterations trained) that generated each response (bounded staleness);
    with partial rollouts, the oldest of its tokens' versions."""
    token_versions: torch.Tensor | None = None
    """(B, Lr) long, the policy version each response token was sampled with (partial rollouts: a response
    continued across weight updates mixes versions; 0 on padding); None: every token has its response's."""
    rollout_logprobs: torch.Tensor | None = None
    """(B, Lr) float, log-probs reported by the generator (0 on padding)."""
    old_logprobs: torch.Tensor | None = None
    """(B, Lr) float, log-probs under the policy that generated the data, recomputed by inference."""
    ref_logprobs: torch.Tensor | None = None
    """(B, Lr) float, log-probs under the reference policy (for a KL term)."""
    values: torch.Tensor | None = None
    """(B, Lr) float, critic values for each response position."""
    advantages: torch.Tensor | None = None
    """(B, Lr) float."""
    returns: torch.Tensor | None = None
    """(B, Lr) float."""
    meta: dict = field(default_factory=dict)
    """Non-tensor side data (e.g. prompt texts, answers); lists in it are indexed like the batch."""

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @classmethod
    def from_groups(
        cls,
        groups: Sequence[ResponseGroup],
        pad_id: int,
        group_ids: Sequence[int] | None = None,
    ) -> RolloutBatch:
        """Flatten groups into a batch (rows in group order); group ids default to each group's prompt_index."""
        ids = [g.prompt_index for g in groups] if group_ids is None else list(group_ids)
        if len(ids) != len(groups):
            raise ValueError(f"{len(groups)} groups but {len(ids)} group ids")
        prompts, responses, logprobs, gids, truncated = [], [], [], [], []
        for gid, g in zip(ids, groups):
            for r in g.responses:
                prompts.append(g.prompt_ids)
                responses.append(r.token_ids)
                logprobs.append(r.logprobs)
                gids.append(gid)
                truncated.append(r.finish_reason == "length")
        prompt_ids, prompt_mask = left_pad(prompts, pad_id)
        return cls(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=right_pad(responses, pad_id),
            response_mask=right_pad([[1] * len(r) for r in responses], 0),
            group_ids=torch.tensor(gids, dtype=torch.long),
            truncated=torch.tensor(truncated, dtype=torch.bool),
            pad_id=pad_id,
            rollout_logprobs=right_pad(logprobs, 0.0, dtype=torch.float32),
        )

    @property
    def loss_mask(self) -> torch.Tensor:
        """(B, Lr) the tokens losses and advantages are taken over: `action_mask`, else `response_mask`."""
        return self.response_mask if self.action_mask is None else self.action_mask

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, Lp + Lr) prompt followed by response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, Lp + Lr) 1 on real tokens."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def _tensor_fields(self) -> list[str]:
        return [f.name for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]

    def select(self, index: torch.Tensor | Sequence[int]) -> RolloutBatch:
        """Rows `index` of every tensor field (and of list-valued meta)."""
        index = torch.as_tensor(index, dtype=torch.long)
        updates = {name: getattr(self, name)[index] for name in self._tensor_fields()}
        meta = {k: ([v[i] for i in index.tolist()] if isinstance(v, list) else v) for k, v in self.meta.items()}
        return replace(self, **updates, meta=meta)

    def split(self, micro_batch_size: int) -> list[RolloutBatch]:
        """Consecutive micro-batches of at most `micro_batch_size` rows."""
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        n = len(self)
        return [self.select(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on `device`."""
        return replace(self, **{name: getattr(self, name).to(device) for name in self._tensor_fields()})

    def split_tokens(self, budget: int) -> list[RolloutBatch]:
        """Consecutive micro-batches of at most `budget` real tokens (prompt + response) each; a row above
        the budget makes a micro-batch of its own."""
        if budget <= 0:
            raise ValueError(f"token budget must be positive, got {budget}")
        sizes = (self.prompt_mask.sum(-1) + self.response_mask.sum(-1)).tolist()
        cuts, used = [0], 0
        for i, size in enumerate(sizes):
            if i > cuts[-1] and used + size > budget:
                cuts.append(i)
                used = 0
            used += size
        cuts.append(len(sizes))
        return [self.select(range(a, b)) for a, b in zip(cuts, cuts[1:]) if b > a]

    @staticmethod
    def cat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """Join batches row-wise, re-padding prompts (left) and responses (right) to the longest."""
        if not batches:
            raise ValueError("cannot concatenate zero batches")
        first = batches[0]
        lp = max(b.prompt_ids.shape[1] for b in batches)
        lr = max(b.response_ids.shape[1] for b in batches)
        out = {}
        for f in fields(first):
            name = f.name
            vals = [getattr(b, name) for b in batches]
            if name in ("pad_id", "meta"):
                continue
            present = [v is not None for v in vals]
            if not any(present):
                out[name] = None
                continue
            if not all(present):
                raise ValueError(f"field {name!r} is set in some batches and not in others")
            if name in _PROMPT_FIELDS:
                pad = first.pad_id if name == "prompt_ids" else 0
                vals = [torch.nn.functional.pad(v, (lp - v.shape[1], 0), value=pad) for v in vals]
            elif name in _RESPONSE_FIELDS:
                pad = first.pad_id if name == "response_ids" else 0
                vals = [torch.nn.functional.pad(v, (0, lr - v.shape[1]), value=pad) for v in vals]
            out[name] = torch.cat(vals, dim=0)
        meta: dict = {}
        for k in first.meta:
            vals = [b.meta.get(k) for b in batches]
            meta[k] = sum(vals, []) if all(isinstance(v, list) for v in vals) else first.meta[k]
        return RolloutBatch(**out, pad_id=first.pad_id, meta=meta)
