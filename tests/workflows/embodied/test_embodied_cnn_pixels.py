"""The embodied workflow running the CNN actor-critic on MetaWorld images alone (``observation: image``).

The same env class as the VLA's, the image handed over without instruction or proprio: what SB3's
``CnnPolicy`` sees in the V1 benchmark. Skipped, with the reason, where MetaWorld or an offscreen
OpenGL is missing.
"""

from __future__ import annotations

import math

import pytest

from m2flow.autoplan.entry import train
from m2flow.config import from_dict
from m2flow.envs.metaworld import metaworld_unavailable_reason
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

REASON = metaworld_unavailable_reason()
pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")]


def test_a_cnn_actor_critic_trains_on_images_alone(tmp_path):
    cfg = from_dict(EmbodiedConfig, {
        "placement": "local",
        "seed": 1,
        "env": {"backend": "metaworld", "env_id": "reach-v3", "num_envs": 2, "normalize_obs": False,
                "env_kwargs": {"height": 32, "width": 32, "max_episode_steps": 12, "reward": "dense",
                               "observation": "image"}},
        "rollout_steps": 8,
        "total_env_steps": 2 * 16,
        "algorithm": {"epochs": 2, "minibatch_size": 8, "lr": 1e-3},
        "policy": {"encoder": "cnn", "shared_critic": True, "hidden_sizes": [], "cnn_channels": [8, 16],
                   "cnn_kernels": [4, 3], "cnn_strides": [2, 2], "cnn_features": 32},
        "run_dir": str(tmp_path / "run"),
        "metrics": {"sinks": []},
        "checkpoint_every": 0,
    })
    result = train(EMBODIED, cfg)
    assert [h["env/total_steps"] for h in result.history] == [16, 32]
    last = result.history[-1]
    assert last["actor/updates"] > 0 and last["actor/approx_kl"] > 0  # the update moved the policy
    assert all(math.isfinite(last[k]) for k in ("actor/pg_loss", "critic/value_loss"))
    assert len(result.episodes) == 2  # both envs finished one 12-step episode
