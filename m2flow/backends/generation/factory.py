"""Choosing a generation backend by its config name: the only place that does.

`create_generation_backend` builds a backend that loads its own model, `generation_backend_over` one
over a model another component holds in this process, and `generation_backend_class` is the class
registered under a name. What a backend can do (`in_process`, `compiles`, `continuous`) is read from
`registry.generation_backend_traits` without importing it. Callers pass one `GenerationOptions`;
each backend takes from it what it uses. A built-in backend's module is imported when it is first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from m2flow.backends.generation.registry import GENERATION_BACKENDS, generation_backend_traits

if TYPE_CHECKING:
    from torch import nn

    from m2flow.backends.generation.base import GenerationBackend, GenerationOptions

__all__ = ["backends_that_compile", "check_compile", "create_generation_backend", "generation_backend_class", "generation_backend_over"]


def generation_backend_class(name: str) -> type:
    """The class registered as `name` (its module imported first for a built-in one); unknown names raise
    ValueError listing the valid ones."""
    if name not in GENERATION_BACKENDS:
        raise ValueError(f"unknown generation backend {name!r}; valid: {sorted(GENERATION_BACKENDS)}")
    return GENERATION_BACKENDS[name]


def create_generation_backend(name: str, model_path: str, options: GenerationOptions | None = None,
                              **kwargs: Any) -> GenerationBackend:
    """Build the backend registered as `name` from a local model directory: from `options`
    (`from_options`), else from keyword arguments of the backend's own `from_pretrained`."""
    cls = generation_backend_class(name)
    if options is not None:
        _check_options(name, cls, options)
        return cls.from_options(model_path, options)
    return cls.from_pretrained(model_path, **kwargs)


def generation_backend_over(name: str, model: nn.Module, tokenizer: Any,
                            options: GenerationOptions) -> GenerationBackend:
    """The backend `name` generating from `model` itself (no copy): its in-place updates are what it samples
    from next. Only backends with `in_process` set can; others raise ValueError."""
    cls = generation_backend_class(name)
    if not cls.in_process:
        in_process = sorted(n for n in GENERATION_BACKENDS if generation_backend_traits(n).in_process)
        raise ValueError(f"generation backend {name!r} cannot generate from a model held by another component; "
                         f"in-process backends: {in_process}")
    _check_options(name, cls, options)
    return cls.over_model(model, tokenizer, options)


def _check_options(name: str, cls: type, options: GenerationOptions) -> None:
    check_compile(name, options.compile)


def check_compile(name: str, compile: bool) -> None:
    """ValueError when ``compile`` is asked of a backend that does not compile (configs check it early)."""
    if compile and not generation_backend_traits(name).compiles:
        raise ValueError(f"compile is an option of the {', '.join(map(repr, backends_that_compile()))} "
                         f"backend, not of {name!r}")


def backends_that_compile() -> list[str]:
    """Names of the backends that accept `GenerationOptions.compile`."""
    return sorted(n for n in GENERATION_BACKENDS if generation_backend_traits(n).compiles)
