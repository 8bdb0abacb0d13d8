"""The generation backends by config name, and what each can do, known without importing one.

A built-in backend is declared here with the module that defines it and its `BackendTraits`; its
module (torch, transformers) is imported only when its class is asked for, so a config's validation
and the planner read a backend's traits at no import cost. `register_generation_backend` gives a
declared class its declared traits; a backend registered from elsewhere states them as class attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

from m2flow.algorithms.registry import Registry

__all__ = ["BackendTraits", "GENERATION_BACKENDS", "generation_backend_traits", "register_generation_backend"]


@dataclass(frozen=True)
class BackendTraits:
    """What a generation backend can do, read before one is built (the class attributes of the same names)."""

    in_process: bool
    """It generates from a model object held in the calling process, so it can be built over a model
    another component trains (`generation_backend_over`)."""
    compiles: bool
    """It accepts `GenerationOptions.compile`."""
    continuous: bool
    """It has `ContinuousBatching.generate_stream` (groups handed out as they finish)."""


_BUILT_IN: dict[str, tuple[str, BackendTraits]] = {
    "hf": ("m2flow.backends.generation.hf", BackendTraits(in_process=True, compiles=False, continuous=False)),
    "lean": ("m2flow.backends.generation.lean", BackendTraits(in_process=True, compiles=True, continuous=True)),
    # The engine holds its own copy of the weights, and LLM.generate returns a call's requests together.
    "vllm": ("m2flow.backends.generation.vllm", BackendTraits(in_process=False, compiles=False, continuous=False)),
}
"""Config name -> (the module that registers the backend, its traits)."""

GENERATION_BACKENDS: Registry[type] = Registry(
    "generation backend", {name: home for name, (home, _) in _BUILT_IN.items()})
"""Config name -> backend class, the built-in ones loaded on first use; `register_generation_backend` adds."""

_B = TypeVar("_B", bound=type)


def register_generation_backend(name: str) -> Callable[[_B], _B]:
    """Class decorator registering a backend (a class with `from_pretrained(path, **kw)`); duplicates raise.
    A built-in one gets its declared traits as class attributes."""

    def deco(cls: _B) -> _B:
        GENERATION_BACKENDS.add(name, cls)
        if name in _BUILT_IN:
            for trait, value in asdict(_BUILT_IN[name][1]).items():
                setattr(cls, trait, value)
        return cls

    return deco


def generation_backend_traits(name: str) -> BackendTraits:
    """What the backend registered as ``name`` can do: declared for a built-in one (nothing imported), else
    its class attributes; an unknown name raises ValueError listing the valid ones."""
    if name in _BUILT_IN:
        return _BUILT_IN[name][1]
    if name not in GENERATION_BACKENDS:
        raise ValueError(f"unknown generation backend {name!r}; valid: {sorted(GENERATION_BACKENDS)}")
    cls = GENERATION_BACKENDS[name]
    return BackendTraits(**{trait: bool(getattr(cls, trait)) for trait in BackendTraits.__dataclass_fields__})
