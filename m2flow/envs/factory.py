"""Building single environments by backend name; unknown backends and env ids fail listing the choices."""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable

import gymnasium as gym

from m2flow.envs.config import EnvConfig

logger = logging.getLogger(__name__)

EnvMaker = Callable[[EnvConfig], gym.Env]
"""Builds one (unseeded) single environment from the config."""

TaskExpander = Callable[[EnvConfig], list[str]]
"""Maps a config (its ``env_id``, and ``env_kwargs`` where they matter) to the ids of the vector's envs, env ``i``
taking id ``i mod len``."""

SpacesOf = Callable[[EnvConfig], tuple[gym.Space, gym.Space]]
"""The single env's (observation, action) spaces from the config alone, nothing built."""

_BACKENDS: dict[str, EnvMaker] = {}
_EXPANDERS: dict[str, TaskExpander] = {}
_SPACES: dict[str, SpacesOf] = {}


def register_env_backend(
    name: str, expand: TaskExpander | None = None, spaces: SpacesOf | None = None
) -> Callable[[EnvMaker], EnvMaker]:
    """Decorator registering an env maker under ``name``; registering a name twice raises.

    ``expand``: for backends whose ``env_id`` may name several tasks (a multi-task vector), the
    function listing them; without it every env of the vector is built from ``env_id`` itself.
    ``spaces``: for backends whose envs are costly to build (a simulator and a render context), the
    spaces from the config alone; without it :func:`env_spaces` builds one env and closes it.
    """

    def wrap(maker: EnvMaker) -> EnvMaker:
        if name in _BACKENDS:
            raise ValueError(f"env backend {name!r} is already registered")
        _BACKENDS[name] = maker
        if expand is not None:
            _EXPANDERS[name] = expand
        if spaces is not None:
            _SPACES[name] = spaces
        return maker

    return wrap


def env_ids(config: EnvConfig) -> list[str]:
    """The distinct env ids ``config.env_id`` names (one, unless the backend expands task lists)."""
    expand = _EXPANDERS.get(config.backend)
    return [config.env_id] if expand is None else expand(config)


def config_for_env(config: EnvConfig, index: int) -> EnvConfig:
    """The config of env ``index`` of a vector: ``config`` with ``env_id`` narrowed to its task."""
    ids = env_ids(config)
    if len(ids) == 1 and ids[0] == config.env_id:
        return config
    return dataclasses.replace(config, env_id=ids[index % len(ids)])


def available_env_backends() -> list[str]:
    """Names of the registered env backends."""
    return sorted(_BACKENDS)


def make_env(config: EnvConfig) -> gym.Env:
    """One single environment built by ``config.backend`` (the first task where ``env_id`` names several)."""
    try:
        maker = _BACKENDS[config.backend]
    except KeyError:
        raise ValueError(
            f"backend: unknown env backend {config.backend!r}; valid: {available_env_backends()}"
        ) from None
    return maker(config_for_env(config, 0))


def env_spaces(config: EnvConfig) -> tuple[gym.Space, gym.Space]:
    """The single env's observation and action spaces: from the backend's ``spaces`` where it has one, else
    from one env built here and closed again."""
    if config.backend in _SPACES:
        return _SPACES[config.backend](config_for_env(config, 0))
    probe = make_env(config)
    try:
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


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


def _expand_metaworld(config: EnvConfig) -> list[str]:
    from m2flow.envs.metaworld import expand_tasks

    return expand_tasks(config.env_id, config.env_kwargs.get("instruction"))


def _metaworld_args(config: EnvConfig) -> tuple[str, dict]:
    from m2flow.envs.metaworld import expand_tasks

    (task,) = expand_tasks(config.env_id, config.env_kwargs.get("instruction"))  # narrowed to one task
    kwargs = dict(config.env_kwargs)
    if config.max_episode_steps is not None:
        kwargs["max_episode_steps"] = config.max_episode_steps
    return task, kwargs


def _metaworld_spaces(config: EnvConfig) -> tuple[gym.Space, gym.Space]:
    # A MetaWorld env costs a scene compile and a render context (seconds at start-up); its spaces follow
    # from the arguments alone.
    from m2flow.envs.metaworld import pixel_env_spaces

    task, kwargs = _metaworld_args(config)
    return pixel_env_spaces(task, **kwargs)


@register_env_backend("metaworld", expand=_expand_metaworld, spaces=_metaworld_spaces)
def _make_metaworld(config: EnvConfig) -> gym.Env:
    # Imported here: MetaWorld (and its pinned MuJoCo) is an optional extra.
    from m2flow.envs.metaworld import MetaWorldPixelEnv

    task, kwargs = _metaworld_args(config)
    return MetaWorldPixelEnv(task, **kwargs)
