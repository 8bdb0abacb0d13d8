"""Snapshots of a single gymnasium env's state, so a resumed run continues the very same episodes.

A snapshot holds, for the env and each of its wrappers, the plain attributes (numbers, booleans,
``None``, numpy arrays, numpy random generators): a ``TimeLimit``'s elapsed steps, a classic-control
env's state vector, the env's random generator. For MuJoCo envs it also holds every array of the
``MjData`` and its time (the integration state alone is not enough: rewards read positions that
MuJoCo derived before the last integration step). An env that drives a simulator object of its own
(MetaWorld's task env inside the pixel env) names it as its ``simulator`` attribute, and that env's
snapshot is taken the same way, nested; the ``MjModel`` arrays such a simulator rewrites on reset
(MetaWorld moves goal sites and objects in the model, not the data) are listed by the outer env's
``simulator_model_arrays`` and saved too. A snapshot is arrays and plain values only, so a
checkpoint file holding it loads without unpickling objects. Envs whose state lives elsewhere (a renderer, a remote
simulator) are restored only as far as those attributes go.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from m2flow.workers.state_file import UnsafeCheckpointError, load_state

_PLAIN = (int, float, bool, str, type(None), np.integer, np.floating, np.bool_)


def _layers(env: gym.Env) -> list[Any]:
    """The wrapper chain from the outermost wrapper down to the unwrapped env."""
    out = [env]
    while isinstance(out[-1], gym.Wrapper):
        out.append(out[-1].env)
    return out


def _plain_attrs(obj: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if isinstance(value, np.random.Generator):
            state[name] = ("generator", copy.deepcopy(value.bit_generator.state))
        elif isinstance(value, np.ndarray):
            state[name] = ("array", value.copy())
        elif isinstance(value, _PLAIN):
            state[name] = ("value", value)
        elif isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value):
            state[name] = ("value", value)
    return state


def _restore_attrs(obj: Any, state: dict[str, Any]) -> None:
    for name, (kind, value) in state.items():
        if kind == "generator":
            current = getattr(obj, name, None)
            if isinstance(current, np.random.Generator):
                current.bit_generator.state = copy.deepcopy(value)
            else:
                generator = np.random.Generator(np.random.PCG64())
                generator.bit_generator.state = copy.deepcopy(value)
                setattr(obj, name, generator)
        elif kind == "array":
            setattr(obj, name, value.copy())
        else:
            setattr(obj, name, value)


def _mujoco_arrays(data: Any) -> dict[str, Any]:
    """Copies of every array an ``MjData`` exposes (its buffers: state, derived and warm-start), and its time."""
    out: dict[str, Any] = {"time": float(data.time)}
    for name in dir(data):
        if name.startswith("_"):
            continue
        try:
            value = getattr(data, name)
        except Exception:  # noqa: BLE001 - a property that needs a model or plugin: not state
            continue
        if isinstance(value, np.ndarray) and value.dtype != object:
            out[name] = value.copy()
    return out


def _restore_mujoco(data: Any, arrays: dict[str, Any]) -> None:
    data.time = arrays["time"]
    for name, value in arrays.items():
        if name == "time":
            continue
        target = getattr(data, name, None)
        if not isinstance(target, np.ndarray):
            raise ValueError(f"the snapshot holds MjData.{name}, this env's MjData has no such array")
        # Arrays sized by the last step's contacts (efc_*) differ between episodes; the next step
        # recomputes them from scratch, so only the model-sized ones need restoring.
        if target.shape == value.shape:
            target[...] = value  # in place: MjData's arrays are views of its own buffers


def _mujoco_parts(env: Any) -> tuple[Any, Any] | None:
    model, data = getattr(env, "model", None), getattr(env, "data", None)
    try:
        import mujoco
    except ImportError:
        return None
    if isinstance(model, mujoco.MjModel) and isinstance(data, mujoco.MjData):
        return model, data
    return None


def get_env_state(env: gym.Env) -> dict[str, Any]:
    """A deep snapshot of ``env``'s state (see the module docstring for what it covers)."""
    layers = _layers(env)
    state: dict[str, Any] = {"layers": [_plain_attrs(layer) for layer in layers]}
    parts = _mujoco_parts(layers[-1])
    if parts is not None:
        state["mujoco"] = _mujoco_arrays(parts[1])
    simulator = getattr(layers[-1], "simulator", None)
    if isinstance(simulator, gym.Env):
        state["simulator"] = get_env_state(simulator)
        model = getattr(simulator, "model", None)
        names = getattr(layers[-1], "simulator_model_arrays", ())
        state["simulator_model"] = {name: np.array(getattr(model, name), copy=True) for name in names}
    return state


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore a snapshot taken by :func:`get_env_state` from an env built the same way."""
    layers = _layers(env)
    if len(layers) != len(state["layers"]):
        raise ValueError(
            f"the snapshot has {len(state['layers'])} wrapper layers, this env has {len(layers)}")
    for layer, attrs in zip(layers, state["layers"]):
        _restore_attrs(layer, attrs)
    if "mujoco" in state:
        parts = _mujoco_parts(layers[-1])
        if parts is None:
            raise ValueError("the snapshot holds MuJoCo physics, this env has none")
        _restore_mujoco(parts[1], state["mujoco"])
    if "simulator" in state:
        simulator = getattr(layers[-1], "simulator", None)
        if not isinstance(simulator, gym.Env):
            raise ValueError("the snapshot holds a simulator env, this env has none")
        set_env_state(simulator, state["simulator"])
        for name, value in state.get("simulator_model", {}).items():
            getattr(simulator.model, name)[...] = value  # in place: MjModel's arrays are views of its buffers


def env_state_file(rank: int) -> str:
    """The name of env rank ``rank``'s file in a checkpoint directory."""
    return f"env_rank{rank}.pt"


def load_env_state(directory: str | Path, rank: int) -> dict[str, Any]:
    """Env rank ``rank``'s saved state; a pickled file of the older format is refused, not run."""
    path = Path(directory) / env_state_file(rank)
    legacy = Path(directory) / f"env_rank{rank}.pkl"
    if not path.is_file() and legacy.is_file():
        raise UnsafeCheckpointError(
            f"{legacy}: refused to load: env state saved as a pickle by an older version (unpickling it "
            "could run code); resume from a checkpoint written by this version"
        )
    return load_state(path)
