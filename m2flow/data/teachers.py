"""Teachers: who writes the demonstrations of an agentic warm start, registered by environment name.

A teacher writes ``Demonstration``s of one environment's episodes (the prompt, then model turns and
observations in turn), as the environment would give them: the warm start trains on the model turns. The
shipped ones are declared here with the module that registers them (imported on first use); a teacher of
your own registers itself beside its environment, in a module named in ``env.imports``::

    @register_teacher("my_env")
    def my_teacher(request: TeachRequest) -> list[Demonstration]:
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from m2flow.algorithms.registry import Registry

__all__ = ["TEACHERS", "Demonstration", "TeachRequest", "Teacher", "register_teacher", "teach"]


@dataclass(frozen=True)
class Demonstration:
    """One worked episode: the prompt, then alternating model turns and observations (last: a model turn)."""

    prompt: str
    turns: tuple[str, ...]
    """Model turn, observation, model turn, ...: odd length, model turns at even indices."""
    kind: str
    """How the teacher played it (calculator: 'tool', 'skip', 'copy_error'; guess_number: 'bisect', 'mistake';
    a demonstrations file: its own, 'file' when it gives none)."""
    correct: bool
    """Whether the episode was solved (the calculator: the final answer is the product)."""


@dataclass(frozen=True)
class TeachRequest:
    """What a teacher is asked for: ``count`` episodes of the environment built with ``env_kwargs``."""

    count: int
    """Demonstrations to write."""
    seed: int
    """The run's seed: the same request gives the same demonstrations."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """The environment's own settings (``env.kwargs``), so the episodes are the ones training will see."""
    turn_end: str = ""
    """How generation ends a model turn that does not end the episode: the rollout's first stop string
    ('' when there is none; then end-of-sequence ends it)."""
    warm_start: Any = None
    """The run's ``model.warm_start`` settings (the shipped teachers' error rates live there)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """``model.warm_start.teacher_kwargs``: a teacher's own settings."""


class Teacher(Protocol):
    """Writes ``request.count`` demonstrations of its environment."""

    def __call__(self, request: TeachRequest) -> list[Demonstration]: ...


TEACHERS: Registry[Teacher] = Registry("teacher", {
    "calculator": "m2flow.data.calculator_demos", "guess_number": "m2flow.data.guess_demos"})
"""Name (by default the environment's) -> teacher; the shipped ones are imported when first used."""


def register_teacher(name: str) -> Callable[[Teacher], Teacher]:
    """Decorator registering a teacher under ``name``; a taken name raises."""
    return TEACHERS.register(name)


def teach(name: str, request: TeachRequest) -> list[Demonstration]:
    """The demonstrations of teacher ``name``, checked: each has an odd number of turns (the last is the
    model's); an unknown name lists the registered teachers."""
    demos = list(TEACHERS.get(name)(request))
    for k, d in enumerate(demos):
        if not isinstance(d, Demonstration) or len(d.turns) % 2 != 1:
            raise ValueError(f"teacher {name!r}: demonstration {k} is not a Demonstration with an odd number of "
                             f"turns (model turn, observation, ..., model turn): {d!r}")
    if len(demos) != request.count:
        raise ValueError(f"teacher {name!r} wrote {len(demos)} demonstrations; {request.count} were asked for")
    return demos
