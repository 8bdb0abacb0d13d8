"""Checkpoint files that load without running code: tensors and plain values only.

``save_state`` writes a tree of dicts, lists, tuples, strings, numbers, ``None``, torch tensors and
numpy arrays/scalars with ``torch.save``; numpy values become tagged dicts over a uint8 tensor of
their bytes (exact, any dtype but ``object``). ``load_state`` reads it back with
``torch.load(weights_only=True)``, whose unpickler accepts none of the globals an arbitrary pickle
would call, so a crafted file fails instead of running. Files of the older pickled format fail the
same way, with a message naming the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from m2flow.config.errors import InputError
from m2flow.models.weight_files import refusal_reason

_TAG = "__m2flow_state__"


class UnsafeCheckpointError(InputError):
    """A checkpoint file holds something other than tensors and plain values; it was not loaded (the
    message names the file; the CLI prints it as one ``error:`` line)."""


def encode(obj: Any) -> Any:
    """``obj`` with numpy arrays and scalars replaced by tagged dicts that torch loads safely."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("numpy arrays of Python objects cannot be checkpointed safely")
        flat = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
        return {_TAG: "ndarray", "dtype": obj.dtype.str, "shape": list(obj.shape), "bytes": torch.from_numpy(flat.copy())}
    if isinstance(obj, np.generic):
        return {_TAG: "scalar", "dtype": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(encode(v) for v in obj)
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.Size)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__} safely: save tensors, arrays and plain values")


def decode(obj: Any) -> Any:
    """The inverse of ``encode``."""
    if isinstance(obj, dict):
        kind = obj.get(_TAG)
        if kind == "ndarray":
            raw = obj["bytes"].numpy().tobytes()
            return np.frombuffer(raw, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        if kind == "scalar":
            return np.dtype(obj["dtype"]).type(obj["value"])
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def save_state(obj: Any, path: str | Path) -> None:
    """Write ``obj`` (see the module docstring for what it may hold) to ``path``."""
    torch.save(encode(obj), path)


def load_state(path: str | Path, map_location: Any = None) -> Any:
    """Read a file written by ``save_state``; a file that would need code to load raises."""
    try:
        raw = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's own advice (load with weights_only=False) is exactly what must not happen here.
        raise UnsafeCheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain values "
            f"(a checkpoint of an older format, or not written by m2flow): {refusal_reason(exc)}"
        ) from None
    return decode(raw)
