"""The building blocks of the functional Qwen2/Llama forward, shared by its three uses.

`functional_lm` (padded forward and cached generation), `functional_decode` (the compiled decoding
step) and `packed_forward` (the packed training forward) all run a decoder layer from these pieces:
the supported-model check, the model's shape constants, a layer's weights (fused or split), RMS norm,
rotary embedding, attention inputs, the gated MLP and the padded causal mask. They read the weights of
an ordinary HF model and hold no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "LayerWeights",
    "Shape",
    "attention_inputs",
    "check_supported",
    "decoder_layer",
    "gated_mlp",
    "layer_weights",
    "padded_causal_mask",
    "rms_norm",
    "rope_table",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def check_supported(config: Any) -> None:
    """Raise ValueError naming the first feature of `config` the functional forward does not implement."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"functional forward: model type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"functional forward: rope scaling {rope_type!r} is not supported (only the default RoPE)")
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("functional forward: partial_rotary_factor != 1 is not supported")
    layer_types = getattr(config, "layer_types", None)
    sliding = "sliding_attention" in layer_types if layer_types else bool(getattr(config, "use_sliding_window", False))
    if sliding:
        raise ValueError("functional forward: sliding window attention is not supported (only full attention)")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"functional forward: activation {act!r} is not supported (only 'silu')")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise ValueError("functional forward: pretraining_tp > 1 is not supported")


@dataclass(frozen=True)
class Shape:
    """The constants of one model's forward, read from its modules."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    padding_idx: int | None
    attention_dropout: float

    @staticmethod
    def of(model: nn.Module) -> Shape:
        attn = model.model.layers[0].self_attn
        cfg = model.config
        return Shape(
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
class LayerWeights:
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


def layer_weights(layer: nn.Module, fused: bool) -> LayerWeights:
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
    return LayerWeights(
        input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight,
        qkv=qkv, qkv_bias=qkv_bias, o=a.o_proj.weight, o_bias=a.o_proj.bias,
        gate_up=gate_up, gate_up_bias=gate_up_bias, down=m.down_proj.weight, down_bias=m.down_proj.bias,
    )


def _project(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None],
             sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    if len(weights) == 1:
        return F.linear(x, weights[0], biases[0]).split(sizes, dim=-1)
    return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))


def attention_inputs(x: torch.Tensor, w: LayerWeights, s: Shape, cos: torch.Tensor,
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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # As HF: normalize in float32, cast back, then scale by the weight in the weight's dtype.
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, T, heads, D) with cos/sin (B, T, 1, D) (HF's rotate_half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rope_table(inv_freq: torch.Tensor, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (..., D) of integer `positions` (...), computed in float32 as HF does."""
    freqs = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def decoder_layer(h: torch.Tensor, w: LayerWeights, s: Shape, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor | None, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                   start: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
    """One pre-norm block on h (B, T, hidden); `mask` (B, 1, T, S) bool (True: attend) or additive float.
    With `cache` (keys, values (B, KV, Lmax, D)) the new keys and values are written at [start, start + T)
    and attention runs over [0, start + T)."""
    b, t, _ = h.shape
    q, k, v = attention_inputs(rms_norm(h, w.input_norm, s.eps), w, s, cos, sin)
    if cache is not None:
        keys, values = cache
        keys[:, :, start : start + t] = k
        values[:, :, start : start + t] = v
        k, v = keys[:, :, : start + t], values[:, :, : start + t]
    if t <= FEW_QUERIES and mask is not None and mask.is_floating_point() and not dropout_p:
        o = _few_query_attention(q, k, v, mask, s)
    else:
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None and t > 1,
            scale=s.head_dim**-0.5, enable_gqa=s.num_heads != s.num_kv_heads,
        )
    h = h + F.linear(o.transpose(1, 2).reshape(b, t, s.num_heads * s.head_dim), w.o, w.o_bias)
    return h + gated_mlp(rms_norm(h, w.post_norm, s.eps), w, s)


FEW_QUERIES = 64
"""Most new tokens per row (a decoding step, a turn's prefill) whose attention, given an additive mask, runs as
plain batched products rather than the fused kernel."""


def _few_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                         s: Shape) -> torch.Tensor:
    """Attention of a few new tokens per row (a decoding step, a short prefill), q (B, H, T, D) over k, v (B, KV,
    S, D) with an additive bias (B, 1, 1 or T, S): two batched products and a softmax, the query heads of one key
    head side by side. For so few queries on a CPU these three calls cost less than the fused attention kernel."""
    b, heads, t, d = q.shape
    kv = k.shape[1]
    group = heads // kv
    scores = torch.matmul(q.reshape(b, kv, group * t, d), k.transpose(-1, -2)).mul_(s.head_dim**-0.5)
    scores = scores.view(b, kv, group, t, -1).add_(bias[:, :, None])
    out = torch.matmul(torch.softmax(scores, dim=-1).view(b, kv, group * t, -1), v)
    return out.view(b, heads, t, d)


def gated_mlp(x: torch.Tensor, w: LayerWeights, s: Shape) -> torch.Tensor:
    """The SiLU-gated MLP of normed x."""
    gate, up = _project(x, w.gate_up, w.gate_up_bias, (s.intermediate, s.intermediate))
    return F.linear(F.silu(gate) * up, w.down, w.down_bias)


def padded_causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool: query i sees real keys j <= i, and always itself (so no row is empty)."""
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    mask = causal & attention_mask.bool()[:, None, None, :]
    return mask | torch.eye(length, dtype=torch.bool, device=attention_mask.device)
