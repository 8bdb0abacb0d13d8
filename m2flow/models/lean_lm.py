"""A lean functional forward for Qwen2 and Llama decoder models, for fast generation and for training.

At the sizes m2flow trains on a CPU (a few layers, width ~100) a Hugging Face forward is dominated by
per-module Python overhead, not arithmetic. This module runs the same computation as a handful of
tensor calls per layer (fused q/k/v and gate/up projections, `F.scaled_dot_product_attention`,
`F.rms_norm`), reading the weights of an ordinary HF model. It serves two uses:

* Generation, `LeanLM.from_hf(model)`: q/k/v and gate/up weights are fused into new tensors once;
  `prefill(input_ids, attention_mask, max_new_tokens)` fills a preallocated KV cache and returns the
  last position's logits, `decode(tokens, state)` adds one token per row. Left padding is handled by
  the attention mask; positions count real tokens only (as `position_ids_from_mask`). The fused copies
  are rebuilt by `refresh()`, which `prefill` calls by itself whenever a parameter of the model was
  modified in place or replaced since the last build (`stale`). With `compile=True` each `decode` runs
  one `torch.compile`d step over the whole cache instead (`m2flow.models.lean_decode`).
* Training and scoring, `lean_logits(model, input_ids, attention_mask, position_ids, logits_to_keep)`:
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

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DecodeState", "LeanLM", "check_supported", "lean_logits"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def check_supported(config: Any) -> None:
    """Raise ValueError naming the first feature of `config` the lean forward does not implement."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"lean forward: model type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"lean forward: rope scaling {rope_type!r} is not supported (only the default RoPE)")
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("lean forward: partial_rotary_factor != 1 is not supported")
    layer_types = getattr(config, "layer_types", None)
    sliding = "sliding_attention" in layer_types if layer_types else bool(getattr(config, "use_sliding_window", False))
    if sliding:
        raise ValueError("lean forward: sliding window attention is not supported (only full attention)")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"lean forward: activation {act!r} is not supported (only 'silu')")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError("lean forward: pretraining_tp > 1 is not supported")


@dataclass(frozen=True)
class _Shape:
    """The constants of one model's forward, read from its modules."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    padding_idx: int | None
    attention_dropout: float

    @staticmethod
    def of(model: nn.Module) -> _Shape:
        attn = model.model.layers[0].self_attn
        cfg = model.config
        return _Shape(
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=attn.head_dim,
            intermediate=model.model.layers[0].mlp.gate_proj.out_features,
            eps=model.model.norm.variance_epsilon,
            padding_idx=model.model.embed_tokens.padding_idx,
            attention_dropout=float(getattr(cfg, "attention_dropout", 0.0) or 0.0),
        )

    @property
    def qkv_sizes(self) -> tuple[int, int, int]:
        return (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)


@dataclass
class _Layer:
    """One decoder layer's weights: projections either fused (one weight) or split (one per output)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: list[torch.Tensor]  # [W_qkv] fused, or [W_q, W_k, W_v]
    qkv_bias: list[torch.Tensor | None]
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: list[torch.Tensor]  # [W_gate_up] fused, or [W_gate, W_up]
    gate_up_bias: list[torch.Tensor | None]
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _fuse(tensors: list[torch.Tensor | None], rows: list[int]) -> torch.Tensor | None:
    """Concatenate weights (or biases) along the output dimension; a missing bias counts as zeros."""
    if all(t is None for t in tensors):
        return None
    ref = next(t for t in tensors if t is not None)
    parts = [t if t is not None else ref.new_zeros(r) for t, r in zip(tensors, rows)]
    return torch.cat(parts, dim=0)


def _layer(layer: nn.Module, fused: bool) -> _Layer:
    a, m = layer.self_attn, layer.mlp
    qkv = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
    qkv_bias = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
    gate_up = [m.gate_proj.weight, m.up_proj.weight]
    gate_up_bias = [m.gate_proj.bias, m.up_proj.bias]
    if fused:
        qkv_rows = [w.shape[0] for w in qkv]
        qkv, qkv_bias = [_fuse(qkv, qkv_rows)], [_fuse(qkv_bias, qkv_rows)]  # type: ignore[list-item]
        gu_rows = [w.shape[0] for w in gate_up]
        gate_up, gate_up_bias = [_fuse(gate_up, gu_rows)], [_fuse(gate_up_bias, gu_rows)]  # type: ignore[list-item]
    return _Layer(
        input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight,
        qkv=qkv, qkv_bias=qkv_bias, o=a.o_proj.weight, o_bias=a.o_proj.bias,
        gate_up=gate_up, gate_up_bias=gate_up_bias, down=m.down_proj.weight, down_bias=m.down_proj.bias,
    )


def _project(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None],
             sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    if len(weights) == 1:
        return F.linear(x, weights[0], biases[0]).split(sizes, dim=-1)
    return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))


def _attention_inputs(x: torch.Tensor, w: _Layer, s: _Shape, cos: torch.Tensor,
                      sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rotated queries (B, H, T, D), rotated keys and values (B, KV, T, D) of normed x (B, T, hidden)."""
    b, t, _ = x.shape
    heads, kv, d = s.num_heads, s.num_kv_heads, s.head_dim
    if len(w.qkv) == 1:
        # Fused: queries and keys are adjacent columns, so one rotation covers both.
        qkv = F.linear(x, w.qkv[0], w.qkv_bias[0])
        qk = _rotate(qkv[..., : (heads + kv) * d].view(b, t, heads + kv, d), cos, sin)
        q, k = qk[:, :, :heads], qk[:, :, heads:]
        v = qkv[..., (heads + kv) * d :].view(b, t, kv, d)
    else:
        q, k, v = _project(x, w.qkv, w.qkv_bias, s.qkv_sizes)
        q = _rotate(q.view(b, t, heads, d), cos, sin)
        k = _rotate(k.view(b, t, kv, d), cos, sin)
        v = v.view(b, t, kv, d)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # As HF: normalize in float32, cast back, then scale by the weight in the weight's dtype.
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, T, heads, D) with cos/sin (B, T, 1, D) (HF's rotate_half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rope_table(inv_freq: torch.Tensor, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (..., D) of integer `positions` (...), computed in float32 as HF does."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _decoder_layer(h: torch.Tensor, w: _Layer, s: _Shape, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor | None, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                   start: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
    """One pre-norm block on h (B, T, hidden); `mask` (B, 1, T, S) bool (True: attend) or additive float.
    With `cache` (keys, values (B, KV, Lmax, D)) the new keys and values are written at [start, start + T)
    and attention runs over [0, start + T)."""
    b, t, _ = h.shape
    q, k, v = _attention_inputs(_rms_norm(h, w.input_norm, s.eps), w, s, cos, sin)
    if cache is not None:
        keys, values = cache
        keys[:, :, start : start + t] = k
        values[:, :, start : start + t] = v
        k, v = keys[:, :, : start + t], values[:, :, : start + t]
    o = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None and t > 1,
        scale=s.head_dim**-0.5, enable_gqa=s.num_heads != s.num_kv_heads,
    )
    h = h + F.linear(o.transpose(1, 2).reshape(b, t, s.num_heads * s.head_dim), w.o, w.o_bias)
    return h + _mlp(_rms_norm(h, w.post_norm, s.eps), w, s)


def _mlp(x: torch.Tensor, w: _Layer, s: _Shape) -> torch.Tensor:
    """The SiLU-gated MLP of normed x."""
    gate, up = _project(x, w.gate_up, w.gate_up_bias, (s.intermediate, s.intermediate))
    return F.linear(F.silu(gate) * up, w.down, w.down_bias)


def _padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool: query i sees real keys j <= i, and always itself (so no row is empty)."""
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    mask = causal & attention_mask.bool()[:, None, None, :]
    return mask | torch.eye(length, dtype=torch.bool, device=attention_mask.device)


def lean_logits(
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
    s = _Shape.of(model)
    base = model.model
    if position_ids is None:
        if attention_mask is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        else:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    mask = None if attention_mask is None else _padded_causal_mask(attention_mask)
    h = F.embedding(input_ids, base.embed_tokens.weight, s.padding_idx)
    cos, sin = _rope_table(base.rotary_emb.inv_freq, position_ids, h.dtype)
    cos, sin = cos[:, :, None], sin[:, :, None]  # (B, L, 1, D): one table for all heads
    dropout = s.attention_dropout if model.training else 0.0
    for layer in base.layers:
        h = _decoder_layer(h, _layer(layer, fused=False), s, cos, sin, mask, dropout_p=dropout)
    if logits_to_keep:
        h = h[:, -logits_to_keep:]
    return F.linear(_rms_norm(h, base.norm.weight, s.eps), model.lm_head.weight, model.lm_head.bias)


@dataclass
class DecodeState:
    """The KV cache and bookkeeping of one batch being decoded by `LeanLM`."""

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


class LeanLM:
    """Generation with a preallocated KV cache over fused copies of a Qwen2/Llama model's weights."""

    def __init__(self, model: nn.Module, compile: bool = False) -> None:
        check_supported(model.config)
        self.model = model
        """The HF model whose parameters are read (and fused on `refresh`)."""
        self.shape = _Shape.of(model)
        self.compiled: Any = None
        """With `compile`: the `CompiledDecode` that runs each decoding step (`m2flow.models.lean_decode`)."""
        if compile:
            from m2flow.models.lean_decode import CompiledDecode

            self.compiled = CompiledDecode(self.shape)
        self._layers: list[_Layer] = []
        self._built_from: list[tuple[int, int, int]] | None = None
        self.refresh()

    @classmethod
    def from_hf(cls, model: nn.Module, compile: bool = False) -> LeanLM:
        """A generator over `model` (a `Qwen2ForCausalLM` or `LlamaForCausalLM`); ValueError if unsupported.
        With `compile` each decoding step runs as one `torch.compile`d function (see `lean_decode`)."""
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
        self._layers = [_layer(layer, fused=True) for layer in self.model.model.layers]
        self._built_from = self._fingerprint()

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
            h = _decoder_layer(h, w, s, cos, sin, mask, (state.keys[i], state.values[i]), state.length)
        state.length += input_ids.shape[1]
        return F.linear(_rms_norm(h[:, -1], base.norm.weight, s.eps), self.model.lm_head.weight,
                        self.model.lm_head.bias)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                repeats: int = 1) -> tuple[torch.Tensor, DecodeState]:
        """Run left-padded prompts (B, Lp) through the model: logits (B * repeats, V) of the next token, and
        the state to `decode` with, which has room for `max_new_tokens` more tokens. With `repeats` > 1
        every prompt stands for that many consecutive rows (samples of one prompt): it runs once and its
        cache is copied."""
        if self.stale:
            self.refresh()
        b, lp = input_ids.shape
        s, dtype, device = self.shape, self.model.model.embed_tokens.weight.dtype, input_ids.device
        cache = (len(self._layers), b, s.num_kv_heads, lp + max_new_tokens, s.head_dim)
        # An additive bias, not a bool mask: the attention kernel would convert a bool mask every step.
        key_bias = torch.full((b, 1, 1, lp + max_new_tokens), float("-inf"), dtype=dtype, device=device)
        key_bias[:, 0, 0, :lp].masked_fill_(attention_mask.bool(), 0.0)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        table = torch.arange(lp + max_new_tokens, device=device)
        cos, sin = _rope_table(self.model.model.rotary_emb.inv_freq, table, dtype)
        state = DecodeState(
            # Zeros, not garbage: a compiled step attends over empty slots too (at weight 0; NaN * 0 is NaN).
            keys=torch.zeros(cache, dtype=dtype, device=device), values=torch.zeros(cache, dtype=dtype, device=device),
            key_bias=key_bias, next_position=positions[:, -1:] + 1, length=0, cos=cos, sin=sin,
        )
        logits = self._forward(input_ids, positions, state, _padded_causal_mask(attention_mask))
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
