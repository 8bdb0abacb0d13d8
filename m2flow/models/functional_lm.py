"""A functional forward for Qwen2 and Llama decoder models, for fast generation and for training.

At the sizes m2flow trains on a CPU (a few layers, width ~100) a Hugging Face forward is dominated by
per-module Python overhead, not arithmetic. This module runs the same computation as a handful of
tensor calls per layer (fused q/k/v and gate/up projections, `F.scaled_dot_product_attention`,
`F.rms_norm`), reading the weights of an ordinary HF model. It serves two uses:

* Generation, `FunctionalLM.from_hf(model)`: q/k/v and gate/up weights are fused into new tensors once;
  `prefill(input_ids, attention_mask, max_new_tokens)` fills a preallocated KV cache and returns the
  last position's logits, `decode(tokens, state)` adds one token per row. Left padding is handled by
  the attention mask; positions count real tokens only (as `position_ids_from_mask`). The fused copies
  are rebuilt by `refresh()`, which `prefill` calls by itself whenever a parameter of the model was
  modified in place or replaced since the last build (`stale`). With `compile=True` each `decode` runs
  one `torch.compile`d step over the whole cache instead (`m2flow.models.functional_decode`).
* Training and scoring, `functional_logits(model, input_ids, attention_mask, position_ids, logits_to_keep)`:
  one forward over full (left- or right-) padded sequences that reads the model's live parameters (no
  copies), so gradients reach them exactly as through `model(...)`; returns the logits of the last
  `logits_to_keep` positions only (0: all), like HF's `logits_to_keep`. Pass the bare HF model, not a
  DDP/FSDP wrapper: the wrapper's forward (and its gradient hooks) is bypassed.

Supported: `model_type` 'qwen2' or 'llama', default RoPE, full attention in every layer, a SiLU-gated MLP,
tied or untied output head, attention and MLP biases as the config sets them. `check_supported` raises
ValueError naming anything else (rope scaling, sliding windows, other activations or architectures).

Where it deviates from HF: a padding position attends to itself (HF lets it attend to nothing or to
everything, depending on the attention kernel), so no row of the attention is empty; the outputs at
padding positions are meaningless either way and nothing real attends to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from m2flow.models.functional_decode import CompiledDecode
from m2flow.models.functional_layers import (
    LayerWeights,
    Shape,
    check_supported,
    decoder_layer,
    layer_weights,
    padded_causal_mask,
    rms_norm,
    rope_table,
)

__all__ = ["DecodeState", "FunctionalLM", "KVPrefix", "check_supported", "functional_logits"]


def functional_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """Logits (B, k, V) of the last k = `logits_to_keep` positions of input_ids (B, L) (k = 0: all L).

    The same values as `model(input_ids, attention_mask, position_ids=..., logits_to_keep=k).logits`
    at real positions, computed from the model's live parameters: gradients flow into them when
    enabled. `attention_mask` (B, L) is 1 on real tokens (None: no padding); `position_ids` (B, L)
    default to counting real tokens only. Attention dropout applies when the model is in training mode.
    """
    check_supported(model.config)
    s = Shape.of(model)
    base = model.model
    if position_ids is None:
        if attention_mask is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        else:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    mask = None if attention_mask is None else padded_causal_mask(attention_mask)
    h = F.embedding(input_ids, base.embed_tokens.weight, s.padding_idx)
    cos, sin = rope_table(base.rotary_emb.inv_freq, position_ids, h.dtype)
    cos, sin = cos[:, :, None], sin[:, :, None]  # (B, L, 1, D): one table for all heads
    dropout = s.attention_dropout if model.training else 0.0
    for layer in base.layers:
        h = decoder_layer(h, layer_weights(layer, fused=False), s, cos, sin, mask, dropout_p=dropout)
    if logits_to_keep:
        h = h[:, -logits_to_keep:]
    return F.linear(rms_norm(h, base.norm.weight, s.eps), model.lm_head.weight, model.lm_head.bias)


@dataclass(frozen=True)
class KVPrefix:
    """The cached keys and values of one sequence's first tokens, to prefill a longer sequence on top of
    (a multi-turn episode's context at its next turn): only the tokens after them run through the model."""

    keys: torch.Tensor
    """(layers, KV, L, D) the keys of ``ids``, in order."""
    values: torch.Tensor
    """(layers, KV, L, D) their values."""
    ids: tuple[int, ...]
    """The L token ids they were computed from (position i holds token i)."""
    build: int = 0
    """The `FunctionalLM.builds` of the weights they were computed with (other weights: not reused)."""

    def usable(self, ids: Sequence[int]) -> int:
        """How many leading positions serve ``ids``: the tokens both begin with, leaving at least the last of
        ``ids`` to run (its logits are the next token's). Keys of a causal model depend on earlier tokens only,
        so a prefix of the cache is the cache of that prefix."""
        limit = min(len(self.ids), len(ids) - 1)
        if limit > 0 and tuple(ids[:limit]) == self.ids[:limit]:
            return limit
        n = 0
        while n < limit and ids[n] == self.ids[n]:
            n += 1
        return n


@dataclass
class DecodeState:
    """The KV cache and bookkeeping of one batch being decoded by `FunctionalLM`."""

    keys: torch.Tensor
    """(layers, B, KV, Lmax, D) cached keys; slots [0, length) are filled."""
    values: torch.Tensor
    """(layers, B, KV, Lmax, D) cached values."""
    key_bias: torch.Tensor
    """(B, 1, 1, Lmax) attention bias of each cache slot: 0 for real tokens, -inf for padding and empty slots."""
    next_position: torch.Tensor
    """(B, 1) position id of each row's next token."""
    length: int
    """Cache slots filled so far."""
    cos: torch.Tensor
    """(P, D) rotary cos of positions 0..P-1, enough for every token this batch may take."""
    sin: torch.Tensor
    """(P, D) rotary sin."""

    def select(self, rows: torch.Tensor) -> None:
        """Make the batch the given rows (B',) of it, in that order: drop finished rows, or repeat rows."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)
        self.key_bias = self.key_bias.index_select(0, rows)
        self.next_position = self.next_position.index_select(0, rows)

    def row_prefix(self, row: int, ids: Sequence[int], build: int) -> KVPrefix:
        """Row ``row``'s cache as a ``KVPrefix`` of ``ids`` (the tokens it has run: one per filled real slot),
        computed with the weights of ``build``."""
        slots = (self.key_bias[row, 0, 0, : self.length] == 0).nonzero().squeeze(1)
        if len(slots) != len(ids):
            raise ValueError(f"row {row} holds {len(slots)} cached tokens, not the {len(ids)} given")
        return KVPrefix(self.keys[:, row].index_select(2, slots), self.values[:, row].index_select(2, slots),
                        tuple(ids), build)

    def trim(self) -> None:
        """Drop the leading cache slots that no row attends to (after rows left, or after a merge)."""
        used = (self.key_bias[:, 0, 0, : self.length] == 0).any(0).nonzero()
        first = int(used[0]) if len(used) else self.length
        if first:
            self.keys, self.values = self.keys[:, :, :, first:], self.values[:, :, :, first:]
            self.key_bias = self.key_bias[..., first:]
            self.length -= first

    @staticmethod
    def merge(a: DecodeState, b: DecodeState, room: int) -> DecodeState:
        """One state with a's rows, then b's, and space for ``room`` more tokens in every row.

        Rows keep their positions; only their cache slots move: each state's filled slots end at the
        merged length (the shorter one left-padded with slots nobody attends to, -inf in key_bias), so
        a row attends to exactly the keys it attended to before.
        """
        length = max(a.length, b.length)
        layers, _, kv, _, d = a.keys.shape
        rows = a.keys.shape[1] + b.keys.shape[1]
        shape = (layers, rows, kv, length + room, d)
        keys = torch.zeros(shape, dtype=a.keys.dtype, device=a.keys.device)
        values = torch.zeros_like(keys)
        key_bias = torch.full((rows, 1, 1, length + room), float("-inf"), dtype=a.key_bias.dtype,
                              device=a.key_bias.device)
        row = 0
        for s in (a, b):
            n, at = s.keys.shape[1], length - s.length
            keys[:, row : row + n, :, at:length] = s.keys[:, :, :, : s.length]
            values[:, row : row + n, :, at:length] = s.values[:, :, :, : s.length]
            key_bias[row : row + n, ..., at:length] = s.key_bias[..., : s.length]
            row += n
        # The rotary tables hold the same values per position; the longer covers both states' rows.
        table = a if a.cos.shape[0] >= b.cos.shape[0] else b
        return DecodeState(keys=keys, values=values, key_bias=key_bias,
                           next_position=torch.cat((a.next_position, b.next_position)), length=length,
                           cos=table.cos, sin=table.sin)


class FunctionalLM:
    """Generation with a preallocated KV cache over fused copies of a Qwen2/Llama model's weights."""

    def __init__(self, model: nn.Module, compile: bool = False) -> None:
        check_supported(model.config)
        self.model = model
        """The HF model whose parameters are read (and fused on `refresh`)."""
        self.shape = Shape.of(model)
        self.compiled: CompiledDecode | None = None
        """With `compile`: the `CompiledDecode` that runs each decoding step (`m2flow.models.functional_decode`)."""
        if compile:
            self.compiled = CompiledDecode(self.shape)
        self._layers: list[LayerWeights] = []
        self._built_from: list[tuple[int, int, int]] | None = None
        self.builds = 0
        """How many times the fused weights were built: the weights' version, for cached keys (`KVPrefix`)."""
        self.refresh()

    @classmethod
    def from_hf(cls, model: nn.Module, compile: bool = False) -> FunctionalLM:
        """A generator over `model` (a `Qwen2ForCausalLM` or `LlamaForCausalLM`); ValueError if unsupported.
        With `compile` each decoding step runs as one `torch.compile`d function (see `functional_decode`)."""
        return cls(model, compile=compile)

    def _fingerprint(self) -> list[tuple[int, int, int]]:
        # In-place updates (optimizer steps, load_state_dict, copy_) bump a tensor's version counter;
        # moves and reassignments change its storage or the parameter object.
        return [(id(p), p.data_ptr(), p._version) for p in self.model.parameters()]

    @property
    def stale(self) -> bool:
        """Whether a parameter changed since the fused weights were built."""
        return self._built_from != self._fingerprint()

    @torch.no_grad()
    def refresh(self) -> None:
        """(Re)build the fused weights from the model's current parameters."""
        self._layers = [layer_weights(layer, fused=True) for layer in self.model.model.layers]
        self._built_from = self._fingerprint()
        self.builds += 1

    def release(self) -> None:
        """Drop the fused copies (e.g. before the model is moved off the device); rebuilt on the next use."""
        self._layers = []
        self._built_from = None

    # ---- the forward -------------------------------------------------------------------------

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, state: DecodeState,
                 mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) of the last of input_ids (B, T), appended to the cache at state.length."""
        base, s = self.model.model, self.shape
        h = F.embedding(input_ids, base.embed_tokens.weight)
        cos, sin = state.cos[positions][:, :, None], state.sin[positions][:, :, None]  # (B, T, 1, D)
        for i, w in enumerate(self._layers):
            h = decoder_layer(h, w, s, cos, sin, mask, (state.keys[i], state.values[i]), state.length)
        state.length += input_ids.shape[1]
        return F.linear(rms_norm(h[:, -1], base.norm.weight, s.eps), self.model.lm_head.weight,
                        self.model.lm_head.bias)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                repeats: int = 1, prefixes: Sequence[KVPrefix | None] | None = None,
                ) -> tuple[torch.Tensor, DecodeState]:
        """Run left-padded prompts (B, Lp) through the model: logits (B * repeats, V) of the next token, and
        the state to `decode` with, which has room for `max_new_tokens` more tokens. With `repeats` > 1
        every prompt stands for that many consecutive rows (samples of one prompt): it runs once and its
        cache is copied. With `prefixes`, row i's prompt continues the tokens of ``prefixes[i]`` (None: no
        tokens before it): their cached keys and values are put before it, its positions count on from
        them, and only the prompt runs through the model."""
        if self.stale:
            self.refresh()
        b, lp = input_ids.shape
        s, dtype, device = self.shape, self.model.model.embed_tokens.weight.dtype, input_ids.device
        lc = max((len(p.ids) for p in prefixes if p is not None), default=0) if prefixes is not None else 0
        cache = (len(self._layers), b, s.num_kv_heads, lc + lp + max_new_tokens, s.head_dim)
        # An additive bias, not a bool mask: the attention kernel would convert a bool mask every step.
        key_bias = torch.full((b, 1, 1, lc + lp + max_new_tokens), float("-inf"), dtype=dtype, device=device)
        key_bias[:, 0, 0, lc : lc + lp].masked_fill_(attention_mask.bool(), 0.0)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        table = torch.arange(lc + lp + max_new_tokens, device=device)
        cos, sin = rope_table(self.model.model.rotary_emb.inv_freq, table, dtype)
        state = DecodeState(
            # Zeros, not garbage: a compiled step attends over empty slots too (at weight 0; NaN * 0 is NaN).
            keys=torch.zeros(cache, dtype=dtype, device=device), values=torch.zeros(cache, dtype=dtype, device=device),
            key_bias=key_bias, next_position=positions[:, -1:] + 1, length=0, cos=cos, sin=sin,
        )
        mask = padded_causal_mask(attention_mask)
        if lc:
            # Each row's cached tokens end at slot lc (left-padded, as merged states are); the prompt follows.
            assert prefixes is not None
            cached = torch.zeros(b, dtype=torch.long)
            for i, p in enumerate(prefixes):
                if p is not None and p.ids:
                    n = len(p.ids)
                    state.keys[:, i, :, lc - n : lc] = p.keys
                    state.values[:, i, :, lc - n : lc] = p.values
                    cached[i] = n
            cached = cached.to(device)
            key_bias[:, 0, 0, :lc].masked_fill_(torch.arange(lc, device=device) >= lc - cached[:, None], 0.0)
            positions = positions + cached[:, None]
            state.next_position = positions[:, -1:] + 1
            state.length = lc
            seen = (key_bias[:, :, :, :lc] == 0).expand(b, 1, lp, lc)
            mask = torch.cat((seen, mask), dim=-1)
        # Additive, converted once for every layer: a short prompt's attention then runs as batched products.
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
        logits = self._forward(input_ids, positions, state, mask)
        if repeats > 1:
            rows = torch.arange(b, device=device).repeat_interleave(repeats)
            state.select(rows)
            logits = logits.index_select(0, rows)
        return logits, state

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Append one token per row, tokens (B,); logits (B, V) of the token after it."""
        positions = state.next_position
        state.next_position = positions + 1
        if self.compiled is not None:
            # The step attends over the whole cache (the new token through its own keys), then the
            # token's keys and values go into its slot.
            base = self.model.model
            logits, keys, values = self.compiled(
                tokens, positions, state.keys, state.values, state.key_bias, state.cos, state.sin,
                base.embed_tokens.weight, tuple(self._layers), base.norm.weight, self.model.lm_head.weight,
                self.model.lm_head.bias)
            slot = state.length
            state.keys[:, :, :, slot : slot + 1] = keys
            state.values[:, :, :, slot : slot + 1] = values
            state.key_bias[:, :, :, slot] = 0.0
            state.length += 1
            return logits
        state.key_bias[:, :, :, state.length] = 0.0
        return self._forward(tokens[:, None], positions, state, state.key_bias[..., : state.length + 1])
