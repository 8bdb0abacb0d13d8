"""The text-environment interface, in the gymnasium style GEM uses, and the registry environments add themselves to.

An environment speaks text both ways: ``reset(seed)`` gives the first observation (the task), and
``step(action_text)`` takes one model turn and gives the next observation, the turn's reward and whether
the episode ended (``terminated``: by the task; ``truncated``: by a limit of the environment).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from m2flow.algorithms.registry import Registry


@runtime_checkable
class TextEnv(Protocol):
    """One text environment; an instance plays one episode at a time."""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode (the same seed, the same episode): (first observation, info)."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One model turn in: (observation, reward, terminated, truncated, info)."""
        ...


TEXT_ENVS: Registry[Callable[..., TextEnv]] = Registry("text environment", {
    "calculator": "m2flow.envs.text.calculator", "guess_number": "m2flow.envs.text.guess",
    "gem": "m2flow.envs.text.adapters", "reasoning_gym": "m2flow.envs.text.adapters"})
"""Name -> factory of an environment (keyword arguments are the environment's own settings); the built-in
ones are declared with the module that registers them, imported when one is first made."""


def register_text_env(name: str) -> Callable[[Callable[..., TextEnv]], Callable[..., TextEnv]]:
    """Decorator registering an environment class or factory under ``name``; a taken name raises."""
    return TEXT_ENVS.register(name)
