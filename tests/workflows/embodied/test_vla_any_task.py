"""A MetaWorld task outside MT10 from start to finish: ``m2flow demos`` -> the behaviour-cloning warm start ->
RL iterations from its weights -> ``m2flow eval`` of the checkpoint. Tiny sizes (16x16 images, a one-layer
VLA, short episodes); skipped, with the reason, where MetaWorld or an offscreen OpenGL is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from m2flow.autoplan.entry import train
from m2flow.cli import main
from m2flow.config import from_dict
from m2flow.envs.metaworld import metaworld_unavailable_reason
from m2flow.models.vla import VLAPolicy
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.embodied.warm_start import METRICS_FILE, POLICY_FILE, WARM_START_DIR
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

REASON = metaworld_unavailable_reason()
pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")]

TASK = "handle-press-v3"
TINY_VLA = {"height": 16, "width": 16, "dim": 16, "depth": 1, "heads": 2, "stem_channels": [8], "grid": 2,
            "num_bins": 16}


def run_config(tmp_path: Path, demos: Path) -> EmbodiedConfig:
    """Two envs of the task, 8 steps an iteration, 2 iterations, warm-started from ``demos``."""
    return from_dict(EmbodiedConfig, {
        "placement": "local", "seed": 2, "run_dir": str(tmp_path / "run"), "metrics": {"sinks": ["jsonl"]},
        "env": {"backend": "metaworld", "env_id": TASK, "num_envs": 2, "normalize_obs": False,
                "normalize_reward": False, "info_keys": ["is_success"],
                "env_kwargs": {"height": 16, "width": 16, "max_episode_steps": 12, "reward": "dense"}},
        "rollout_steps": 8, "total_env_steps": 32, "checkpoint_every": 2,
        "algorithm": {"epochs": 1, "minibatch_size": 8, "lr": 1e-3},
        "policy": {"kind": "vla", "vla": dict(TINY_VLA),
                   "warm_start": {"demos": str(demos), "epochs": 3, "batch_size": 32, "lr": 3e-3}}})


def test_demos_warm_start_rl_and_eval_on_a_task_outside_mt10(tmp_path, capsys):
    demos = tmp_path / "demos.npz"
    assert main(["demos", TASK, "--episodes", "1", "--image-size", "16", "-o", str(demos)]) == 0
    cfg = run_config(tmp_path, demos)
    result = train(EMBODIED, cfg)
    run_dir = Path(cfg.run_dir)
    assert len(result.history) == 2 and result.history[-1]["env/total_steps"] == 32

    losses = [json.loads(line)["warm_start/loss"] for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]  # the cloning fitted the expert's tokens
    cloned = torch.load(run_dir / WARM_START_DIR / POLICY_FILE, weights_only=True)["policy"]
    trained = torch.load(run_dir / "checkpoints" / "step_000002" / "actor.pt", weights_only=True)["policy"]
    assert any(not torch.equal(cloned[k], trained[k]) for k in cloned)  # RL moved the weights ...
    torch.manual_seed(0)
    fresh = VLAPolicy(cfg.policy.vla, 4).state_dict()
    key = "stem.net.0.weight"
    # ... from the cloned ones: two small updates leave them far nearer the warm start than any fresh start
    assert (trained[key] - cloned[key]).abs().mean() < 0.2 * (trained[key] - fresh[key]).abs().mean()

    capsys.readouterr()
    out = tmp_path / "eval.json"
    code = main(["eval", str(run_dir / "checkpoints" / "step_000002"), "--episodes", "1", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    line = capsys.readouterr().out
    assert "over 1 episodes" in line and "sampled actions" in line
    results = json.loads(out.read_text())
    assert results["eval/episodes"] == 1 and results["eval/sampled_episodes"] == 1
    # MetaWorld reports success: greedy and sampled, each a rate over the held-out episodes
    assert results["eval/success"] in (0.0, 1.0) and results["eval/sampled_success"] in (0.0, 1.0)
    assert f"success {results['eval/success']:.2f}" in line
