"""The generation-backend interface: sampling parameters and the `GenerationBackend` protocol."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from m2flow.data.batch import Response, ResponseGroup

__all__ = [
    "GenerationBackend",
    "Response",
    "ResponseGroup",
    "SamplingParams",
    "create_generation_backend",
    "register_generation_backend",
]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses."""

    n: int = 1
    """Responses per prompt (the group size)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    max_new_tokens: int = 32
    """Most tokens generated per response."""
    stop: tuple[str, ...] = ()
    """Strings that end a response when they appear in its text."""
    seed: int | None = None
    """Seed for sampling; the same seed, prompts and chunking give the same responses. None: global RNG."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            # A bare string would be iterated character by character; take it as one stop string.
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


@runtime_checkable
class GenerationBackend(Protocol):
    """Samples groups of responses for token-id prompts; knows nothing about datasets or rewards."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[ResponseGroup]:
        """One group of `params.n` responses per prompt, in prompt order."""
        ...

    def generate_iter(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        prompts_per_chunk: int | None = None,
    ) -> Iterator[ResponseGroup]:
        """Yield each prompt's group as soon as it is finished (prompts are processed in chunks)."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy (possibly a subset of) the policy weights in, by parameter name."""
        ...

    def offload(self) -> None:
        """Release device memory (weights, KV cache) so another component can use the device."""
        ...

    def onload(self) -> None:
        """Bring the weights back onto the device after `offload`."""
        ...


_BACKENDS: dict[str, type] = {}

_B = TypeVar("_B", bound=type)


def register_generation_backend(name: str) -> Callable[[_B], _B]:
    """Class decorator registering a backend (a class with `from_pretrained(path, **kw)`); duplicates raise."""

    def deco(cls: _B) -> _B:
        if name in _BACKENDS:
            raise ValueError(f"generation backend {name!r} is already registered")
        _BACKENDS[name] = cls
        return cls

    return deco


def create_generation_backend(name: str, model_path: str, **kwargs: Any) -> GenerationBackend:
    """Build the backend registered as `name` from a local model directory."""
    # Importing the package registers the built-in backends.
    import m2flow.backends.generation  # noqa: F401

    if name not in _BACKENDS:
        raise ValueError(f"unknown generation backend {name!r}; valid: {sorted(_BACKENDS)}")
    return _BACKENDS[name].from_pretrained(model_path, **kwargs)


IN_PROCESS_BACKENDS = ("hf", "lean")
"""Backends that generate from a model object held in the calling process (`generation_backend_over`)."""


def generation_backend_over(name: str, model: torch.nn.Module, tokenizer: Any, **kwargs: Any) -> GenerationBackend:
    """The backend `name` generating from `model` itself (no copy): its in-place updates are what it samples
    from next. Only the in-process backends (`IN_PROCESS_BACKENDS`) can; others raise ValueError."""
    import m2flow.backends.generation  # noqa: F401  (registers the built-in backends)

    if name not in IN_PROCESS_BACKENDS:
        raise ValueError(f"generation backend {name!r} cannot generate from a model held by another component; "
                         f"in-process backends: {list(IN_PROCESS_BACKENDS)}")
    return _BACKENDS[name](model, tokenizer, **kwargs)
