"""The generation-backend interface: sampling parameters, build options and the `GenerationBackend` protocol
(the registry the backends add themselves to is `registry.py`; `factory.py` chooses among them by config name)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from m2flow.backends.generation.registry import GENERATION_BACKENDS, register_generation_backend
from m2flow.data.batch import Response, ResponseGroup

__all__ = [
    "GENERATION_BACKENDS",
    "ContinuousBatching",
    "GenerationBackend",
    "GenerationOptions",
    "Response",
    "ResponseGroup",
    "SamplingParams",
    "register_generation_backend",
    "text_before_stop",
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


def text_before_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` cut before the first stop string in it (all of it when it holds none)."""
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text


@dataclass(frozen=True)
class GenerationOptions:
    """How a generation backend is built; each backend reads the fields it uses and ignores the others."""

    device: str | torch.device = "cpu"
    """Device of an in-process model (a vLLM engine places itself on the visible GPU)."""
    dtype: str = "float32"
    """Weight dtype by torch name: 'float32', 'bfloat16' or 'float16'."""
    seed: int = 0
    """Engine seed (vLLM); the in-process backends seed each chunk from `SamplingParams.seed`."""
    compile: bool = False
    """Run each decoding step `torch.compile`d (only backends with `compiles` set accept it)."""

    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as a torch dtype."""
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]


@runtime_checkable
class GenerationBackend(Protocol):
    """Samples groups of responses for token-id prompts; knows nothing about datasets or rewards."""

    in_process: ClassVar[bool]
    """Whether it generates from a model object held in the calling process (`module`), so it can be
    built over a model another component trains (`generation_backend_over`)."""
    compiles: ClassVar[bool]
    """Whether it accepts `GenerationOptions.compile`."""
    continuous: ClassVar[bool]
    """Whether it has `ContinuousBatching.generate_stream` (groups handed out as they finish)."""

    @property
    def module(self) -> nn.Module | None:
        """The model generated from, when it lives in this process (weights can be loaded into it in
        place); None for an engine of its own (vLLM)."""
        ...

    @property
    def pad_id(self) -> int:
        """The id that pads prompts and the responses' tails."""
        ...

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
        """Copy (possibly a subset of) the policy weights in, by parameter name; also between `offload` and
        `onload`, and then they are the weights generated from after `onload`."""
        ...

    def offload(self) -> None:
        """Release device memory (weights, KV cache) so another component can use the device."""
        ...

    def onload(self) -> None:
        """Bring the weights back onto the device after `offload`."""
        ...


@runtime_checkable
class ContinuousBatching(Protocol):
    """What a backend with `continuous` set adds to `GenerationBackend`."""

    def generate_stream(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int],
                        max_running: int, prefixes: Sequence[Any] | None = None,
                        keep: dict[int, Any] | None = None, flight: Any | None = None) -> Iterator[list[ResponseGroup]]:
        """At most `max_running` responses in the running batch, each prompt's group yielded (in a list of
        the groups that finished together) once all its responses ended, waiting prompts taking the
        freed rows; prompt p's draws are seeded by `seeds[p]` alone. `prefixes[p]` (optional): the cache a
        row of `keep` returned earlier, for a prompt that continues that row's tokens (a multi-turn
        context): only the tokens after it run. `keep` (optional): filled with each row's cache as it
        ends, by row index p * n + j. `flight` (optional, an `inflight.InFlight`): weight updates polled
        between decoding steps, rows begun by an earlier stream, and the rows left when it is closed early."""
        ...
