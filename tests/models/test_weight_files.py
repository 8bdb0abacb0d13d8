"""Model files checked before and while loading: a bad one fails naming the file, a too-long response naming
the key; a pickle carrying code is never run."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from m2flow.config.errors import ConfigError, InputError
from m2flow.models.weight_files import (
    ModelFileError,
    check_max_new_tokens,
    check_safetensors,
    max_positions,
    readable_weights,
    refusal_reason,
)


def _weights(path: Path) -> Path:
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(path))
    return path


def test_a_whole_file_passes_a_truncated_or_overwritten_one_is_named(tmp_path):
    good = _weights(tmp_path / "model.safetensors")
    check_safetensors(tmp_path)
    os.truncate(good, good.stat().st_size - 8)
    with pytest.raises(ModelFileError, match=f"{good}: not a readable safetensors file"):
        check_safetensors(tmp_path)
    raw = bytearray(_weights(good).read_bytes())
    raw[8:16] = b"\x00" * 8
    good.write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match="model.safetensors: not a readable") as info:
        check_safetensors(good)
    assert isinstance(info.value, InputError)


class _Runs:
    def __reduce__(self):
        return (os.system, ("echo ran",))


def test_a_refused_pickle_names_the_file_and_not_torch_s_advice(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"x": _Runs()}, path)
    with pytest.raises(ModelFileError) as info:
        with readable_weights(tmp_path):
            torch.load(path, weights_only=True)
    message = str(info.value)
    assert message.startswith(f"{path}: refused to load") and "posix.system" in message
    assert "weights_only" not in message and "\n" not in message
    assert refusal_reason(pickle.UnpicklingError("x\n\nUnsupported global: GLOBAL a.b\nmore")) == "Unsupported global: GLOBAL a.b"


def test_max_new_tokens_must_leave_room_for_a_prompt():
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64, name_or_path="/m"))
    check_max_new_tokens("rollout.sampling.max_new_tokens", 63, model)
    with pytest.raises(ConfigError, match=r"^rollout\.sampling\.max_new_tokens: 64 tokens do not fit in the 64 "
                                          r"positions of /m .* use at most 63"):
        check_max_new_tokens("rollout.sampling.max_new_tokens", 64, model)
    check_max_new_tokens("max_new_tokens", 10**6, None)  # an engine of its own (vLLM) checks for itself
    assert max_positions(SimpleNamespace(n_positions=128)) == 128 and max_positions(SimpleNamespace()) is None
