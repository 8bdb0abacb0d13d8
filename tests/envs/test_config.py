from __future__ import annotations

import pytest

from m2flow.config import ConfigError, from_dict, undocumented
from m2flow.envs import EnvConfig


def test_every_field_documented():
    assert undocumented(EnvConfig) == []


def test_loads_from_plain_data_and_names_the_bad_key():
    cfg = from_dict(EnvConfig, {"env_id": "Hopper-v5", "num_envs": 4, "num_groups": 2})
    assert (cfg.env_id, cfg.num_envs, cfg.num_groups) == ("Hopper-v5", 4, 2)
    with pytest.raises(ConfigError, match=r"num_groups: must be in \[1, num_envs=4\], got 5"):
        from_dict(EnvConfig, {"num_envs": 4, "num_groups": 5})
    with pytest.raises(ConfigError, match="gamma"):
        from_dict(EnvConfig, {"gamma": 1.5})
