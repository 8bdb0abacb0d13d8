"""`FunctionalLM`'s decoding step as one function over the whole KV cache, so `torch.compile` can fuse it.

An eager decoding step of a small model on a CPU is mostly the fixed cost of its ~40 tensor calls per
layer (norms, rotary embedding, residual adds, attention), not arithmetic. `torch.compile` fuses the
element-wise calls into a few generated kernels and leaves the matrix products to the BLAS library;
on G1's model (hidden 128, 4 layers, 16 rows, one thread) a step is 1.4-1.5x faster
(`benchmarks/functional_decode_step.py`).

To give the compiler shapes that do not change from step to step, `decode_step` attends over every
slot of the preallocated cache, not over the filled ones only: the cache's attention bias is -inf on
empty slots (as on padding), so they weigh nothing, and the caches are zero-filled when allocated, so
an empty slot holds no NaN. The step only reads the cache: the new token attends to itself through
the keys and values it just computed, which it returns for the caller (`FunctionalLM.decode`) to write into
their slot. (Written inside the compiled function, the in-place update of an input would copy the
whole cache every step.) Attention is two matrix products and a softmax, which the compiler fuses;
grouped-query attention (fewer key/value heads than query heads) groups the query heads of each
key/value head, as HF's `repeat_kv` pairs them.

`CompiledDecode` compiles it once per process with the batch, cache-length and rotary-table dimensions
marked dynamic (any batch size and cache length; the batch shrinks as rows end), a single row
excepted: that runs eagerly, since the compiler would specialise size 1 and compile again. The
weights' shapes stay static: compiled with every dimension dynamic (`dynamic=True`), the compiler's
symbolic shape reasoning cost 3x more (the test model: 58 against 19 CPU-s from a cold on-disk
cache, 36 against 5.5 from a warm one; G1's model: 105 against 65-68 CPU-s cold, the same step speed).
Compiling takes ~5-20 s the first time in a process. If it fails (no C++ compiler, for one),
generation goes on eagerly with a warning: the results are the same to float rounding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from m2flow.models.compile_cache import cache_per_float_path
from m2flow.models.functional_layers import LayerWeights, Shape, attention_inputs, gated_mlp, rms_norm

__all__ = ["CompiledDecode", "decode_step"]

log = logging.getLogger(__name__)


def decode_step(shape: Shape, tokens: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, key_bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                embed: torch.Tensor, layers: tuple[LayerWeights, ...], norm: torch.Tensor, head: torch.Tensor,
                head_bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row, tokens (B,) at positions (B, 1), attending to the cache and to itself.

    keys/values (layers, B, KV, Lmax, D) are read, not written; key_bias (B, 1, 1, Lmax) is 0 on the
    slots a row attends to and -inf elsewhere (the new token's slot included: it is attended through
    its own keys). cos/sin (P, D) are the rotary tables. Returns the logits (B, V) and the token's keys
    and values (layers, B, KV, 1, D) for the cache.
    """
    b = tokens.shape[0]
    heads, kv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    h = F.embedding(tokens[:, None], embed)  # (B, 1, hidden)
    cos_t, sin_t = cos[positions][:, :, None], sin[positions][:, :, None]  # (B, 1, 1, D)
    new_keys, new_values = [], []
    for i, w in enumerate(layers):
        q, k, v = attention_inputs(rms_norm(h, w.input_norm, shape.eps), w, shape, cos_t, sin_t)
        q = q.reshape(b, kv, heads // kv, d)  # (B, H, 1, D) grouped by key/value head
        cached = torch.matmul(q, keys[i].transpose(-1, -2)) * d**-0.5 + key_bias  # (B, KV, group, Lmax)
        own = torch.matmul(q, k.transpose(-1, -2)) * d**-0.5  # (B, KV, group, 1)
        p = torch.cat((cached, own), dim=-1).softmax(-1)
        o = torch.matmul(p[..., :-1], values[i]) + p[..., -1:] * v  # (B, KV, group, D)
        h = h + F.linear(o.reshape(b, 1, heads * d), w.o, w.o_bias)
        h = h + gated_mlp(rms_norm(h, w.post_norm, shape.eps), w, shape)
        new_keys.append(k)
        new_values.append(v)
    logits = F.linear(rms_norm(h[:, -1], norm, shape.eps), head, head_bias)
    return logits, torch.stack(new_keys), torch.stack(new_values)


_DYNAMIC_DIMS = ((0,), (0,), (1, 3), (1, 3), (0, 3), (0,), (0,))
"""The dimensions of decode_step's tensor arguments that change from call to call (batch, cache length,
rotary table length), in argument order; the weights that follow keep one shape."""


def _mark_dynamic(args: tuple[Any, ...]) -> None:
    for tensor, dims in zip(args, _DYNAMIC_DIMS):
        torch._dynamo.mark_dynamic(tensor, dims)


class CompiledDecode:
    """`decode_step` for one model shape under `torch.compile` (dynamic shapes); eager if compiling fails."""

    def __init__(self, shape: Shape) -> None:
        def step(*args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return decode_step(shape, *args)

        self.shape = shape
        cache_per_float_path()
        self._compiled: Callable[..., Any] | None = torch.compile(step, fullgraph=True)
        self.failure: str | None = None
        """Why the compiled step was given up (None: it was not)."""

    @property
    def active(self) -> bool:
        """Whether steps still run compiled."""
        return self._compiled is not None

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`decode_step(shape, *args)`, compiled when the batch has two rows or more."""
        if self._compiled is None or args[0].shape[0] < 2:
            return decode_step(self.shape, *args)
        try:
            _mark_dynamic(args)
            return self._compiled(*args)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: decode eagerly from now on
            self.failure = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("compiled decoding step failed (%s); decoding eagerly instead", self.failure)
            self._compiled = None
            return decode_step(self.shape, *args)
