"""The embodied workflow running the small VLA on MetaWorld pixels, in this process (``placement: local``).

A tiny run (32x32 images, a one-layer VLA, a few steps) trains through the same env / rollout /
actor workers as the MLP policies; resuming from its checkpoint gives what the uninterrupted run
gave; ``policy.init_from`` starts it from a saved policy and names a bad file. Skipped, with the
reason, where MetaWorld or an offscreen OpenGL (EGL / OSMesa) is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from m2flow.config import from_dict
from m2flow.config.convert import set_dotted
from m2flow.config.errors import ConfigError, InputError
from m2flow.envs.metaworld import metaworld_unavailable_reason
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.autoplan.entry import train
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

REASON = metaworld_unavailable_reason()
pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")]

LEARNING = ("actor/pg_loss", "critic/value_loss", "actor/approx_kl", "actor/clip_frac", "actor/entropy",
            "env/total_steps", "critic/explained_variance")
TINY_VLA = {"height": 32, "width": 32, "dim": 32, "depth": 1, "heads": 2, "stem_channels": [8, 16], "grid": 2,
            "num_bins": 16}


def vla_config(tmp_path: Path, **overrides) -> EmbodiedConfig:
    """Two reach envs at 32x32, dense reward, 8 steps an iteration, a one-layer VLA: 4 iterations."""
    data = {
        "placement": "local",
        "seed": 3,
        "env": {"backend": "metaworld", "env_id": "reach-v3", "num_envs": 2, "normalize_obs": False,
                "normalize_reward": False, "info_keys": ["success"],
                "env_kwargs": {"height": 32, "width": 32, "max_episode_steps": 12, "reward": "dense"}},
        "rollout_steps": 8,
        "total_env_steps": 4 * 16,
        "algorithm": {"epochs": 2, "minibatch_size": 8, "lr": 1e-3},
        "policy": {"kind": "vla", "vla": dict(TINY_VLA)},
        "run_dir": str(tmp_path / "run"),
        "metrics": {"sinks": ["jsonl"]},
        "checkpoint_every": 2,
    }
    return from_dict(EmbodiedConfig, set_dotted(data, overrides))


def _actor_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    path = run_dir / "checkpoints" / f"step_{step:06d}" / "actor.pt"
    return torch.load(path, weights_only=True)["policy"]


def _saved_policy(path: Path, seed: int) -> dict[str, torch.Tensor]:
    """A VLA of the tiny sizes with weights drawn from ``seed``, saved as behaviour cloning saves one."""
    from m2flow.models.vla import VLAConfig, VLAPolicy, save_policy

    torch.manual_seed(seed)
    policy = VLAPolicy(VLAConfig(**TINY_VLA), 4)
    save_policy(policy, path)
    return {k: v.clone() for k, v in policy.state_dict().items()}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vla")
    start = _saved_policy(root / "bc.pt", seed=11)
    cfg = vla_config(root, **{"policy.init_from": str(root / "bc.pt")})
    return cfg, train(EMBODIED, cfg), start


def test_a_tiny_vla_run_trains_through_the_workers(full_run):
    cfg, result, start = full_run
    assert len(result.history) == 4
    last = result.history[-1]
    assert last["env/total_steps"] == 64 and last["actor/updates"] > 0
    for h in result.history:
        assert all(torch.isfinite(torch.tensor(h[k])) for k in ("actor/pg_loss", "critic/value_loss", "actor/entropy"))
    trained = _actor_weights(Path(cfg.run_dir), 4)
    assert sorted(trained) == sorted(start)
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the updates moved the weights


def test_a_critic_warmup_moves_only_the_value_head_for_its_iterations(tmp_path):
    start = _saved_policy(tmp_path / "bc.pt", seed=11)
    cfg = vla_config(tmp_path, **{"policy.init_from": str(tmp_path / "bc.pt"), "algorithm.critic_warmup": 2,
                                  "algorithm.critic_warmup_lr": 1e-2})
    result = train(EMBODIED, cfg)
    assert [h["actor/critic_warmup"] for h in result.history] == [1.0, 1.0, 0.0, 0.0]
    warmed = _actor_weights(Path(cfg.run_dir), 2)
    assert {k for k in start if not torch.equal(warmed[k], start[k])} == {"value_head.weight", "value_head.bias"}
    trained = _actor_weights(Path(cfg.run_dir), 4)
    assert not torch.equal(trained["action_head.weight"], start["action_head.weight"])  # then the policy learns


def test_the_run_starts_from_init_from(tmp_path):
    from m2flow.envs import EnvConfig, VecEnv
    from m2flow.models.policies import build_policy

    start = _saved_policy(tmp_path / "bc.pt", seed=5)
    cfg = vla_config(tmp_path, **{"policy.init_from": str(tmp_path / "bc.pt")})
    env = VecEnv(EnvConfig(**{**vars(cfg.env), "num_envs": 1}))
    try:
        policy = build_policy(env.single_observation_space, env.single_action_space, cfg.policy)
    finally:
        env.close()
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in start.items())


def test_resume_equals_the_uninterrupted_run(full_run, tmp_path):
    cfg, full, _ = full_run
    checkpoint = Path(cfg.run_dir) / "checkpoints" / "step_000002"
    resumed_cfg = vla_config(tmp_path, resume=str(checkpoint), **{"policy.init_from": cfg.policy.init_from})
    resumed = train(EMBODIED, resumed_cfg)
    assert len(resumed.history) == 2
    for a, b in zip(full.history[2:], resumed.history):
        for key in LEARNING:
            assert a.get(key) == b.get(key), key
    ours, theirs = _actor_weights(Path(resumed_cfg.run_dir), 4), _actor_weights(Path(cfg.run_dir), 4)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_at_staleness_one_the_actor_scores_each_batch_once(tmp_path, monkeypatch):
    # The rollout one iteration ahead: every trajectory was sampled by the weights before the actor's. The
    # behaviour log-probs come with the trajectory, as the VLA sampled its tokens, so the actor scores the
    # batch once, under its own weights, and never under the old ones.
    from m2flow.workers.embodied import batch as batch_module

    passes = []
    real = batch_module.score

    def counted(policy, obs, actions):
        passes.append(len(obs))
        return real(policy, obs, actions)

    monkeypatch.setattr(batch_module, "score", counted)
    cfg = vla_config(tmp_path, **{"algorithm.max_staleness": 1, "checkpoint_every": 0})
    result = train(EMBODIED, cfg)
    assert len(result.history) == 4 and max(h["async/staleness_max"] for h in result.history) == 1
    assert passes == [16] * 4  # one pass of an iteration's 2 envs x 8 decisions each
    stale = [h for h in result.history if h.get("async/age_1_samples")]
    assert stale and all(0.5 < h["async/importance_weight_mean"] < 2.0 for h in stale)


@pytest.mark.parametrize("content, words", [
    (None, "no such file (policy.init_from)"),
    (b"not a torch file at all", "not a readable weights file"),
    ("code", "refused to load"),
    ("other sizes", "do not fit this policy"),
])
def test_a_bad_init_from_file_fails_naming_it(tmp_path, content, words):
    bad = tmp_path / "bad.pt"
    if content is None:
        pass  # no file at all
    elif content == "code":  # a pickle that would call a function when loaded without weights_only
        torch.save({"policy": {"w": torch.zeros(1)}, "hook": Path("x")}, bad)
    elif content == "other sizes":
        from m2flow.models.vla import VLAConfig, VLAPolicy, save_policy

        save_policy(VLAPolicy(VLAConfig(**{**TINY_VLA, "dim": 16}), 4), bad)
    else:
        bad.write_bytes(content)
    with pytest.raises((InputError, ConfigError)) as info:
        train(EMBODIED, vla_config(tmp_path, **{"policy.init_from": str(bad)}))
    assert str(bad) in str(info.value) and words in str(info.value), str(info.value)


def test_placement_auto_profiles_and_plans_the_vla(tmp_path, caplog):
    import json
    import logging

    caplog.set_level(logging.INFO, logger="m2flow")
    cfg = vla_config(tmp_path, placement="auto", **{"cluster.cpu_devices_per_node": 1,
                                                   "auto.profile_iterations": 2, "checkpoint_every": 0})
    result = train(EMBODIED, cfg)
    assert len(result.history) == 4 and result.history[-1]["env/total_steps"] == 64
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert set(profile["components"]) == {"env", "rollout", "actor"}
    assert all(p[2] > 0 for entry in profile["components"].values() for p in entry["points"])
    record = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert record["runs_with"]["placement"] and "auto: chose a" in caplog.text


@pytest.mark.ray
def test_the_vla_trains_with_the_actor_apart_at_staleness_one(cluster, tmp_path):
    # V2's best plan: the envs and the VLA's rollout in one process on device 0, the actor on device 1,
    # the rollout one iteration ahead of the weights.
    cfg = vla_config(tmp_path, placement="env,rollout: 0, actor: 1", **{
        "cluster.cpu_devices_per_node": 2, "algorithm.max_staleness": 1, "rollout.fuse_with_env": True})
    result = train(EMBODIED, cfg)
    assert len(result.history) == 4 and result.history[-1]["env/total_steps"] == 64
    assert result.plan.fused("rollout")
    assert max(h["async/staleness_max"] for h in result.history) == 1
    for h in result.history:
        assert all(torch.isfinite(torch.tensor(h[k])) for k in ("actor/pg_loss", "critic/value_loss"))
    trained, start = _actor_weights(Path(cfg.run_dir), 4), _actor_weights(Path(cfg.run_dir), 2)
    assert any(not torch.equal(trained[k], start[k]) for k in start)
