"""Building text environments by name: the registered ones, the built-ins included (declared in ``base.py``,
their modules imported when one is first made)."""

from __future__ import annotations

from typing import Any

from m2flow.envs.text.base import TEXT_ENVS, TextEnv


def make_text_env(name: str, **kwargs: Any) -> TextEnv:
    """A new environment registered as ``name``; unknown names list the valid ones."""
    return TEXT_ENVS.get(name)(**kwargs)


def text_env_names() -> list[str]:
    """Names of the registered environments (the built-ins included)."""
    return TEXT_ENVS.names()
