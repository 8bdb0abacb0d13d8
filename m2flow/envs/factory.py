"""Building single environments by backend name; unknown backends and env ids fail listing the choices."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable

import gymnasium as gym

from m2flow.envs.config import EnvConfig

logger = logging.getLogger(__name__)

EnvMaker = Callable[[EnvConfig], gym.Env]
"""Builds one (unseeded) single environment from the config."""

_BACKENDS: dict[str, EnvMaker] = {}


def register_env_backend(name: str) -> Callable[[EnvMaker], EnvMaker]:
    """Decorator registering an env maker under ``name``; registering a name twice raises."""

    def wrap(maker: EnvMaker) -> EnvMaker:
        if name in _BACKENDS:
            raise ValueError(f"env backend {name!r} is already registered")
        _BACKENDS[name] = maker
        return maker

    return wrap


def available_env_backends() -> list[str]:
    """Names of the registered env backends."""
    return sorted(_BACKENDS)


def make_env(config: EnvConfig) -> gym.Env:
    """One single environment built by ``config.backend``."""
    try:
        maker = _BACKENDS[config.backend]
    except KeyError:
        raise ValueError(
            f"backend: unknown env backend {config.backend!r}; valid: {available_env_backends()}"
        ) from None
    return maker(config)


def check_env_id(env_id: str) -> None:
    """Raise ValueError with close matches when ``env_id`` is not a registered gymnasium id."""
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.5)
    hint = f"; did you mean one of {close}?" if close else ""
    raise ValueError(f"env_id: {env_id!r} is not a registered gymnasium environment{hint}")


_mujoco_hooked = False


def route_mujoco_warnings() -> None:
    """Send MuJoCo's C-level warnings to ``logging`` instead of stderr and ./MUJOCO_LOG.TXT.

    MuJoCo 4 warns on every load of the stock gymnasium models (a deprecated compiler attribute)
    and appends each warning to a log file in the working directory. A user-installed handler is
    left in place.
    """
    global _mujoco_hooked
    if _mujoco_hooked:
        return
    _mujoco_hooked = True
    try:
        import mujoco
    except ImportError:
        return
    getter = getattr(mujoco, "get_mju_user_warning", None)
    if getter is None or getter() is not None:
        return

    def handler(message: str) -> None:
        level = logging.DEBUG if "deprecated" in message else logging.WARNING
        logger.log(level, "mujoco: %s", message)

    mujoco.set_mju_user_warning(handler)


@register_env_backend("gymnasium")
def _make_gymnasium(config: EnvConfig) -> gym.Env:
    check_env_id(config.env_id)
    route_mujoco_warnings()
    # The passive checker only inspects the first steps; skipping it keeps start-up quiet and fast.
    return gym.make(
        config.env_id,
        max_episode_steps=config.max_episode_steps,
        disable_env_checker=True,
        **config.env_kwargs,
    )


@register_env_backend("maniskill")
def _make_maniskill(config: EnvConfig) -> gym.Env:
    # Imported here: ManiSkill (and its Vulkan renderer) is an optional extra.
    from m2flow.envs.maniskill import make_maniskill_env

    return make_maniskill_env(config)
