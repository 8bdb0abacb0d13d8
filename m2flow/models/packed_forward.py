"""Response logits of a GRPO-style batch with each prompt run once and no padding inside a group.

A training batch holds n responses per prompt, each row left-padded prompt + right-padded response.
Run as such, every row recomputes its prompt and every response is padded to the longest one. This
forward packs each distinct prompt and all of its responses into one sequence instead:

    group u:  [prompt_u tokens][response a minus its last token][response b minus its last token]...

Each response attends to its prompt and causally to itself, never to its siblings; a prompt token
sees the prompt only. Positions are what they are in the padded layout (prompt tokens 0..p-1, token t
of a response p + t), so every logit is the one the padded forward gives, to float rounding, and the
gradients are the same sums. The last token of a response is left out: no logit that is used comes
from it. Groups are padded to the longest packed group, which is shorter than the padded rows of the
group together whenever responses differ in length or prompts repeat.

Distinct prompts are found by comparing prompt rows (ids and mask), so any batch works; a batch of
all-distinct prompts costs about what the padded forward costs. Reads the live parameters of a
Qwen2/Llama HF model like `m2flow.models.functional_lm.functional_logits` (pass the bare model, not a wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from m2flow.models.functional_layers import Shape, check_supported, decoder_layer, layer_weights, rms_norm, rope_table

__all__ = ["PackedGroups", "packed_logits", "pack_groups"]

PAD_SEGMENT = -1  # packed columns past a group's end
PROMPT_SEGMENT = 0  # the group's prompt; response k of the group is segment k + 1


@dataclass
class PackedGroups:
    """Where each token of a padded batch goes in the packed layout (all tensors on the batch's device)."""

    input_ids: torch.Tensor  # (U, N) packed tokens, 0 on padding
    positions: torch.Tensor  # (U, N) position ids as in the padded layout
    segments: torch.Tensor  # (U, N) PROMPT_SEGMENT, k + 1 for the group's k-th response, PAD_SEGMENT
    source: torch.Tensor  # (B, Lr) flat index into (U * N) of the hidden state predicting response token t

    def attention_mask(self) -> torch.Tensor:
        """(U, 1, N, N) bool: causal, within a segment or onto the prompt; padding sees itself only."""
        seg = self.segments
        n = seg.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=seg.device).tril()
        keys = seg[:, None, :]
        visible = (keys == PROMPT_SEGMENT) | (keys == seg[:, :, None])
        visible &= keys != PAD_SEGMENT
        return (causal & visible | torch.eye(n, dtype=torch.bool, device=seg.device))[:, None]


def pack_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                response_mask: torch.Tensor) -> PackedGroups:
    """Pack left-padded prompts (B, Lp) and right-padded responses (B, Lr) by distinct prompt.

    Every row needs at least one prompt token (ValueError otherwise); a response may be empty.
    """
    b, lp = prompt_ids.shape
    lr = response_ids.shape[1]
    dev = prompt_ids.device
    p_mask = prompt_mask.bool()
    if not p_mask.any(-1).all():
        raise ValueError("every row needs at least one prompt token")
    rows = torch.cat([prompt_ids.masked_fill(~p_mask, 0), p_mask.long()], dim=1)
    unique, group = torch.unique(rows, dim=0, return_inverse=True)  # group: (B,) index of the row's prompt
    u = unique.shape[0]
    u_mask = unique[:, lp:].bool()
    p_len = u_mask.sum(-1)  # (U,) real prompt tokens
    r_len = response_mask.bool().sum(-1)
    packed_len = (r_len - 1).clamp(min=0)  # a response's last token is never an input that matters

    # Column where each row's packed response starts: after its prompt and its earlier siblings.
    order = torch.sort(group, stable=True).indices
    sorted_len = packed_len[order]
    ends = sorted_len.cumsum(0)
    group_total = torch.zeros(u, dtype=ends.dtype, device=dev).index_add_(0, group, packed_len)
    group_first = group_total.cumsum(0) - group_total  # exclusive cumsum: where a group's rows begin
    within = torch.empty_like(packed_len)
    within[order] = ends - sorted_len - group_first[group[order]]
    start = p_len[group] + within  # (B,)
    n = int((p_len + group_total).max())

    ids = torch.zeros(u, n, dtype=prompt_ids.dtype, device=dev)
    positions = torch.zeros(u, n, dtype=torch.long, device=dev)
    segments = torch.full((u, n), PAD_SEGMENT, dtype=torch.long, device=dev)
    # Prompts: left-padded in, left-aligned out.
    col = torch.arange(lp, device=dev)[None, :] - (lp - p_len)[:, None]
    uu = torch.arange(u, device=dev)[:, None].expand(u, lp)
    pu, pc = uu[u_mask], col[u_mask]
    ids[pu, pc] = unique[:, :lp][u_mask]
    positions[pu, pc] = pc
    segments[pu, pc] = PROMPT_SEGMENT
    # Responses: token t of row r (t < packed_len) at column start + t, position p + t.
    t = torch.arange(max(lr - 1, 0), device=dev)[None, :]
    valid = t < packed_len[:, None]
    g = group[:, None].expand_as(valid)[valid]
    cols = (start[:, None] + t)[valid]
    ids[g, cols] = response_ids[:, : lr - 1][valid]
    positions[g, cols] = (p_len[group][:, None] + t)[valid]
    group_rows = torch.bincount(group, minlength=u)
    rank = torch.empty_like(group)  # a row's index among its group's rows, in row order
    rank[order] = torch.arange(b, device=dev) - (group_rows.cumsum(0) - group_rows)[group[order]]
    segments[g, cols] = (rank[:, None] + 1).expand_as(valid)[valid]

    # Response token 0 comes from the prompt's last token, token t > 0 from token t - 1.
    steps = torch.arange(lr, device=dev)[None, :]
    src_col = torch.where(steps == 0, (p_len[group] - 1)[:, None], start[:, None] + steps - 1)
    src_col = torch.where(steps < r_len[:, None], src_col, 0)  # padding: any column, masked later
    source = group[:, None] * n + src_col
    return PackedGroups(ids, positions, segments, source)


def packed_logits(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       response_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Logits (B, Lr, V) predicting each response token (row r, token t), from the packed forward.

    The same values as the logits at positions Lp - 1 + t of the padded forward over the rows
    `cat(prompt, response)`, i.e. `functional_logits(..., logits_to_keep=Lr + 1)[:, :-1]`.
    Entries at response padding are logits of some other position: mask them.
    """
    check_supported(model.config)
    s = Shape.of(model)
    base = model.model
    packed = pack_groups(prompt_ids, prompt_mask, response_ids, response_mask)
    mask = packed.attention_mask()
    h = F.embedding(packed.input_ids, base.embed_tokens.weight, s.padding_idx)
    cos, sin = rope_table(base.rotary_emb.inv_freq, packed.positions, h.dtype)
    cos, sin = cos[:, :, None], sin[:, :, None]
    dropout = s.attention_dropout if model.training else 0.0
    for layer in base.layers:
        h = decoder_layer(h, layer_weights(layer, fused=False), s, cos, sin, mask, dropout_p=dropout)
    picked = h.reshape(-1, h.shape[-1])[packed.source]  # (B, Lr, hidden)
    return F.linear(rms_norm(picked, base.norm.weight, s.eps), model.lm_head.weight, model.lm_head.bias)
