"""Configs of tiny embodied runs shared by the end-to-end tests: the toy ContextMatch env, a few thousand steps."""

from __future__ import annotations

from pathlib import Path

from m2flow.config import from_dict
from m2flow.config.convert import set_dotted
from m2flow.workflows.embodied.config import EmbodiedConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "embodied"
TOY = "tests.workers.embodied.toy_envs"
LEARNING = ("actor/pg_loss", "critic/value_loss", "actor/approx_kl", "actor/clip_frac",
            "env/episode_return", "env/episodes", "env/total_steps", "critic/explained_variance")


def toy_config(tmp_path: Path, **overrides) -> EmbodiedConfig:
    """ContextMatch (random policy ~0.33, best 8): a few thousand steps of PPO learn it."""
    data = {
        "placement": "env,rollout,actor: 0",
        "env": {"env_id": "M2flowToy/ContextMatch-v0", "num_envs": 8, "normalize_obs": False,
                "normalize_reward": False},
        "env_worker": {"imports": [TOY]},
        "rollout_steps": 64,
        "total_env_steps": 6 * 512,
        "algorithm": {"epochs": 4, "minibatch_size": 128, "lr": 3e-3},
        "policy": {"hidden_sizes": [32]},
        "run_dir": str(tmp_path / "run"),
        "metrics": {"sinks": ["jsonl"]},
    }
    return from_dict(EmbodiedConfig, set_dotted(data, overrides))
