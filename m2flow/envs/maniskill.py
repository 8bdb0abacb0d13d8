"""ManiSkill 3 tasks as plain single gymnasium envs: state observations on the CPU PhysX backend.

Optional: needs the ``mani_skill`` package and a Vulkan device (SAPIEN creates a renderer even for
state observations). Select with ``EnvConfig(backend="maniskill", env_id="PickCube-v1")``; the
envs then go through the same :class:`~m2flow.envs.vector.VecEnv` loop, groups and normalisation as
any gymnasium env. GPU-batched ManiSkill simulation is a different shape (one env object holding
many copies) and is not covered here.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
from pathlib import Path

import gymnasium as gym

from m2flow.envs.config import EnvConfig

_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")


def maniskill_unavailable_reason() -> str | None:
    """Why ManiSkill envs cannot be built here, or None when they can."""
    if importlib.util.find_spec("mani_skill") is None:
        return "the mani_skill package is not installed"
    if ctypes.util.find_library("vulkan") is None:
        return "no Vulkan loader (libvulkan) is installed"
    if not any(Path(d).is_dir() and any(Path(d).glob("*.json")) for d in _ICD_DIRS):
        return "no Vulkan driver (ICD) is installed"
    return None


def make_maniskill_env(config: EnvConfig) -> gym.Env:
    """One ManiSkill env with state observations on ``physx_cpu``, numpy in and out."""
    reason = maniskill_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend: 'maniskill' is unavailable: {reason}")
    import mani_skill.envs  # noqa: F401  (registers the ManiSkill ids with gymnasium)
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    if config.env_id not in gym.registry:
        raise ValueError(f"env_id: {config.env_id!r} is not a registered ManiSkill environment")
    kwargs = {"obs_mode": "state", "sim_backend": "physx_cpu", "render_mode": None}
    kwargs.update(config.env_kwargs)
    if config.max_episode_steps is not None:
        kwargs["max_episode_steps"] = config.max_episode_steps
    env = gym.make(config.env_id, num_envs=1, **kwargs)
    # CPUGymWrapper unbatches torch outputs into plain numpy; it must be the outermost wrapper.
    return CPUGymWrapper(env)
