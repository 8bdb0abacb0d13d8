"""``policy.init_from``: a policy starts from a saved one; a file that is not one fails naming itself."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.models.init_weights import load_policy_weights, read_policy_state
from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.models.weight_files import ModelFileError

OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def test_an_actor_checkpoint_or_a_bare_state_dict_starts_a_policy(tmp_path):
    torch.manual_seed(1)
    saved = build_policy(OBS, ACT)
    torch.save({"policy": saved.state_dict(), "updater": {"step": 3}}, tmp_path / "actor.pt")
    torch.save(saved.state_dict(), tmp_path / "bare.pt")
    for name in ("actor.pt", "bare.pt"):
        torch.manual_seed(2)
        policy = build_policy(OBS, ACT, PolicyConfig(init_from=str(tmp_path / name)))
        assert all(torch.equal(policy.state_dict()[k], v) for k, v in saved.state_dict().items())


def test_bad_files_fail_naming_the_file(tmp_path):
    policy = build_policy(OBS, ACT)
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save({"policy": {"w": 3}}, tmp_path / "no_tensors.pt")
    torch.save(build_policy(OBS, gym.spaces.Box(-1.0, 1.0, (3,), np.float32)).state_dict(), tmp_path / "other.pt")
    cases = {"missing.pt": "no such file", "empty.pt": "not a readable weights file",
             "no_tensors.pt": "holds no policy state dict", "other.pt": "shape mismatch"}
    for name, words in cases.items():
        with pytest.raises(ModelFileError) as info:
            load_policy_weights(policy, tmp_path / name)
        assert str(tmp_path / name) in str(info.value) and words in str(info.value), str(info.value)


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    class Hook:
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"policy": {"w": torch.zeros(1)}, "hook": Hook()}, tmp_path / "evil.pt")
    with pytest.raises(ModelFileError, match="refused to load"):
        read_policy_state(tmp_path / "evil.pt")
