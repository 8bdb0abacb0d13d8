"""The embodied workflow's behaviour-cloning warm start (``prepare``): trained once, saved with its settings,
reused while they match and trained again when they change; a bad demos file is one error naming it.

Demonstrations here are random packed observations of the tiny VLA's layout: no simulator is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from m2flow.cli import main
from m2flow.config import from_dict
from m2flow.config.convert import set_dotted
from m2flow.config.errors import ConfigError, InputError
from m2flow.envs.metaworld_demos import Demos
from m2flow.models.policy_config import VLAConfig
from m2flow.models.vla import VLAPolicy
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.embodied.warm_start import METRICS_FILE, POLICY_FILE, SETTINGS_FILE, WARM_START_DIR
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

TINY_VLA = {"height": 16, "width": 16, "dim": 16, "depth": 1, "heads": 2, "stem_channels": [8], "grid": 2,
            "num_bins": 8}


def random_demos(path: Path, n: int = 32, size: int | None = None) -> Path:
    """``n`` steps of two episodes: random packed observations, actions that depend on the image."""
    size = size or VLAConfig(**TINY_VLA).layout().size
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (n, size), dtype=np.uint8)
    obs[:, -32:] = 0  # instruction ids and proprio: padding and zeros
    actions = np.tanh(obs[:, :4].astype(np.float32) / 64.0 - 2.0)
    return Demos(obs=obs, actions=actions, episode=np.repeat([0, 1], n // 2), tasks=np.array(["handle-press-v3"] * 2),
                 seeds=np.array([0, 1]), success=np.array([True, True])).save(path)


def config(tmp_path: Path, **overrides) -> EmbodiedConfig:
    data = {"placement": "local", "seed": 1, "run_dir": str(tmp_path / "run"), "metrics": {"sinks": ["jsonl"]},
            "env": {"backend": "metaworld", "env_id": "handle-press-v3", "num_envs": 2, "normalize_obs": False,
                    "env_kwargs": {"height": 16, "width": 16}},
            "rollout_steps": 8, "total_env_steps": 16, "algorithm": {"minibatch_size": 8},
            "policy": {"kind": "vla", "vla": dict(TINY_VLA),
                       "warm_start": {"demos": str(tmp_path / "demos.npz"), "epochs": 2, "batch_size": 16}}}
    return from_dict(EmbodiedConfig, set_dotted(data, overrides))


def test_the_warm_start_is_saved_reused_while_settings_match_and_rerun_when_they_change(tmp_path):
    random_demos(tmp_path / "demos.npz")
    cfg = config(tmp_path)
    run_dir = Path(cfg.run_dir)
    path = EMBODIED.prepare(cfg, run_dir)
    assert path == run_dir / WARM_START_DIR / POLICY_FILE and path.is_file()
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["warm_start/loss"] < rows[0]["warm_start/loss"]  # the cloning learned something
    saved = json.loads((run_dir / WARM_START_DIR / SETTINGS_FILE).read_text())
    assert saved["warm_start"]["epochs"] == 2 and saved["demos"]["path"] == str((tmp_path / "demos.npz").resolve())
    first = torch.load(path, weights_only=True)["policy"]
    stamp = path.stat().st_mtime_ns

    assert EMBODIED.prepare(config(tmp_path, **{"policy.warm_start.threads": 1}), run_dir) == path  # same settings
    assert path.stat().st_mtime_ns == stamp

    EMBODIED.prepare(config(tmp_path, **{"policy.warm_start.lr": 1e-2}), run_dir)  # another lr: trained again
    again = torch.load(path, weights_only=True)["policy"]
    assert any(not torch.equal(first[k], again[k]) for k in first)
    assert json.loads((run_dir / WARM_START_DIR / SETTINGS_FILE).read_text())["warm_start"]["lr"] == 1e-2
    stamp = path.stat().st_mtime_ns
    random_demos(tmp_path / "demos.npz", n=24)  # the file rewritten: trained again
    EMBODIED.prepare(config(tmp_path, **{"policy.warm_start.lr": 1e-2}), run_dir)
    assert path.stat().st_mtime_ns != stamp


def test_no_demos_no_warm_start(tmp_path):
    cfg = config(tmp_path, **{"policy.warm_start.demos": None})
    assert EMBODIED.prepare(cfg, Path(cfg.run_dir)) is None
    assert not (Path(cfg.run_dir) / WARM_START_DIR).exists()


@pytest.mark.parametrize("make, words", [
    (lambda p: None, "no such file (write one with `m2flow demos"),
    (lambda p: p.write_bytes(b"not a zip"), "not a demonstrations file"),
    (lambda p: random_demos(p, size=100), "observations of 100 bytes, but the policy reads"),
])
def test_a_bad_demos_file_is_one_error_naming_it(tmp_path, make, words):
    make(tmp_path / "demos.npz")
    with pytest.raises(InputError) as info:
        EMBODIED.prepare(config(tmp_path), tmp_path / "run")
    message = str(info.value)
    assert message.startswith(f"policy.warm_start.demos: {tmp_path / 'demos.npz'}") and words in message, message
    assert "\n" not in message


def test_bad_warm_start_settings_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="policy.warm_start.epochs: must be >= 1"):
        config(tmp_path, **{"policy.warm_start.epochs": 0})
    with pytest.raises(ConfigError, match="policy.warm_start.demos: behaviour cloning trains the VLA"):
        config(tmp_path, **{"policy.kind": "actor_critic"})


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_a_policy_of_action_chunks_is_cloned_into_its_own_query_slots(tmp_path, decoding):
    random_demos(tmp_path / "demos.npz")
    cfg = config(tmp_path, **{"policy.vla.chunk": 4, "policy.vla.decoding": decoding, "policy.warm_start.epochs": 3})
    path = EMBODIED.prepare(cfg, Path(cfg.run_dir))
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / METRICS_FILE).read_text().splitlines()]
    assert rows[-1]["warm_start/loss"] < rows[0]["warm_start/loss"]
    policy = VLAPolicy(cfg.policy.vla, action_dim=4)
    policy.load_state_dict(torch.load(path, weights_only=True)["policy"])  # strict: the 16 action slots fit
    assert policy.queries.shape[1] == 4 * 4 + 1


def test_the_command_line_prints_one_line_for_a_bad_demos_file_and_an_unknown_task(tmp_path, capsys):
    (tmp_path / "junk.npz").write_bytes(b"junk")
    example = "examples/embodied/metaworld_vla_ppo.yaml"
    code = main(["train", example, f"run_dir={tmp_path / 'run'}", "policy.init_from=null",
                 f"policy.warm_start.demos={tmp_path / 'junk.npz'}", "metrics.sinks=[jsonl]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: policy.warm_start.demos: {tmp_path / 'junk.npz'}")
    code = main(["train", example, f"run_dir={tmp_path / 'run'}", "env.env_id=fly-v3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: env.env_id: no instruction for task 'fly-v3'") and "instruction" in err[0]


def test_m2flow_warm_start_clones_the_policy_alone_and_train_then_reuses_it(tmp_path, capsys):
    import yaml

    from m2flow.config.convert import to_dict

    random_demos(tmp_path / "demos.npz")
    data = {"workflow": "embodied", **to_dict(config(tmp_path))}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    assert main(["warm-start", str(tmp_path / "run.yaml")]) == 0
    path = Path(data["run_dir"]) / WARM_START_DIR / POLICY_FILE
    assert capsys.readouterr().out.strip().endswith(f"warm-started policy (embodied, policy.warm_start): {path}")
    assert path.is_file() and not (Path(data["run_dir"]) / "checkpoints").exists()  # no RL ran
    stamp = path.stat().st_mtime_ns
    assert main(["warm-start", str(tmp_path / "run.yaml")]) == 0  # same settings: reused, not trained again
    assert path.stat().st_mtime_ns == stamp
