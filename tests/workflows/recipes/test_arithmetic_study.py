"""The arithmetic study: each arm from a copy of one warm start, and its markdown table."""

from __future__ import annotations

import pytest
import torch

from m2flow.workflows.recipes.arithmetic_demo import ArithmeticDemoRecipe
from m2flow.workflows.recipes.arithmetic_study import run_seed, table

torch.set_num_threads(1)


def test_table_lists_each_seed_and_the_mean():
    rows = [{"seed": s, "warm_start_steps": 600, "warm_start_accuracy": w, "grpo_accuracy": g,
             "sft_more_accuracy": m, "grpo_seconds": 10.0} for s, w, g, m in [(0, 0.3, 0.9, 0.3), (1, 0.2, 0.7, 0.4)]]
    lines = table(rows).splitlines()
    assert lines[0] == "| seed | warm-start steps | warm_start | grpo | sft_more | GRPO s |"
    assert lines[2] == "| 0 | 600 | 0.300 | 0.900 | 0.300 | 10.0 |"
    assert lines[-1] == "| mean | | 0.250 | 0.800 | 0.350 | |"


def test_run_seed_scores_every_arm_from_the_same_warm_start():
    recipe = ArithmeticDemoRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, sft_steps=2,
                                  sft_batch_size=8, grpo_steps=2, prompts_per_step=4, group_size=2, eval_size=10,
                                  eval_every=1, threads=1)
    out = run_seed(recipe, arms=("grpo", "sft_more"))
    assert out["warm_start_steps"] == 2
    for key in ("warm_start_accuracy", "grpo_accuracy", "sft_more_accuracy"):
        assert 0.0 <= out[key] <= 1.0 and out[key] * 10 == round(out[key] * 10)  # a share of 10 problems
    assert [s for s, _ in out["grpo_curve"]] == [1, 2]
    with pytest.raises(ValueError, match="unknown arm"):
        run_seed(recipe, arms=("nope",))
