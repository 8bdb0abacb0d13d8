"""Checkpoint files load without running code: a crafted pickle is refused, naming the file."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from m2flow.workers.embodied.env_state import load_env_state
from m2flow.workers.embodied.evaluate import load_checkpoint_parts
from m2flow.workers.state_file import UnsafeCheckpointError, load_state, save_state


class _MakesFile:
    """Unpickling this object creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_state_round_trips_tensors_arrays_and_plain_values(tmp_path):
    gen = np.random.default_rng(5)
    state = {
        "w": torch.arange(4.0), "a": np.arange(6, dtype=np.uint32).reshape(2, 3), "s": np.float32(0.25),
        "rng": (np.random.get_state(), gen.bit_generator.state), 3: [None, True, "x", (1, 2.5)],
    }
    save_state(state, tmp_path / "s.pt")
    back = load_state(tmp_path / "s.pt")
    assert torch.equal(back["w"], state["w"]) and back[3] == state[3]
    assert back["a"].dtype == np.uint32 and np.array_equal(back["a"], state["a"])
    assert type(back["s"]) is np.float32 and back["s"] == np.float32(0.25)
    np.random.set_state(back["rng"][0])  # numpy's legacy state is restorable as saved
    assert back["rng"][1] == gen.bit_generator.state


@pytest.mark.parametrize("writer", ["torch", "pickle"])
def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, writer):
    marker = tmp_path / "ran"
    path = tmp_path / "actor.pt"
    payload = {"policy": {"w": torch.zeros(2)}, "updater": _MakesFile(str(marker))}
    if writer == "torch":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    with pytest.raises(UnsafeCheckpointError, match=str(path)):
        load_state(path)
    with pytest.raises(UnsafeCheckpointError, match="actor.pt"):
        load_checkpoint_parts(tmp_path)
    assert not marker.exists()


def test_a_pickled_env_state_of_the_old_format_is_refused_naming_the_file(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "env_rank0.pkl").write_bytes(pickle.dumps({"vec": _MakesFile(str(marker))}))
    with pytest.raises(UnsafeCheckpointError, match="env_rank0.pkl"):
        load_env_state(tmp_path, 0)
    assert not marker.exists()


def test_objects_that_cannot_load_safely_are_refused_at_save_time(tmp_path):
    with pytest.raises(TypeError, match="cannot checkpoint a _MakesFile"):
        save_state({"x": _MakesFile("never")}, tmp_path / "x.pt")
