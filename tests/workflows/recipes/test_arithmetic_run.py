"""`m2flow demo`: the arithmetic demo's plumbing at tiny settings (progress, run directory, metrics, plot)."""

from __future__ import annotations

import json

import pytest
import torch

from m2flow.cli import main
from m2flow.workflows.recipes.arithmetic_run import ArithmeticDemoConfig, run_arithmetic_demo

torch.set_num_threads(1)

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, sft_steps=3, sft_batch_size=8,
            grpo_steps=3, prompts_per_step=4, group_size=2, eval_size=8, eval_every=2, threads=1)


def test_demo_writes_metrics_and_a_plot_and_reports_both_accuracies(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    outcome = run_arithmetic_demo(ArithmeticDemoConfig(**TINY, run_dir=str(run_dir)))
    out = capsys.readouterr().out
    assert str(run_dir.resolve()) in out.splitlines()[0]  # the run directory comes first
    assert "warm start" in out and "GRPO" in out
    assert f"warm start {outcome.warm_start_accuracy:.1%} -> after GRPO {outcome.final_accuracy:.1%}" in out
    assert str(outcome.plot.resolve()) in out

    warm = [json.loads(line) for line in (run_dir / "warm_start.jsonl").read_text().splitlines()]
    assert [r["step"] for r in warm] == [1, 2, 3] and all("actor/sft_loss" in r for r in warm)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["eval/accuracy"] == outcome.warm_start_accuracy
    # Held-out accuracy every eval_every steps and after the last one.
    assert ["eval/accuracy" in r for r in rows[1:]] == [False, True, True]
    assert rows[-1]["eval/accuracy"] == outcome.final_accuracy
    assert all(0.0 <= r["rollout/reward"] <= 1.0 for r in rows[1:])

    import matplotlib.image

    image = matplotlib.image.imread(outcome.plot)
    assert outcome.plot.name == "curves.png" and image.shape[0] > 100 and image.shape[1] > 100
    assert "warm start" in (run_dir / "demo.log").read_text()


def test_a_second_run_in_the_same_directory_starts_fresh(tmp_path):
    cfg = ArithmeticDemoConfig(**{**TINY, "grpo_steps": 1, "sft_steps": 1}, run_dir=str(tmp_path), console=False)
    run_arithmetic_demo(cfg)
    run_arithmetic_demo(cfg)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # step 0 and step 1, once


@pytest.mark.parametrize("override, key", [("grpo_steps=-1", "grpo_steps"), ("sft_steps=-3", "sft_steps"),
                                           ("slip_rate=2", "slip_rate"), ("nonsense=1", "nonsense")])
def test_bad_settings_fail_naming_the_key_before_any_work(override, key, tmp_path, capsys):
    assert main(["demo", override, f"run_dir={tmp_path / 'x'}"]) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
