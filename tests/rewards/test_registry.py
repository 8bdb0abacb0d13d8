"""Reward functions by name or path, with clear errors for bad imports and bad outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.rewards.registry import (
    REWARD_FNS,
    RewardFunctionError,
    RewardLoadError,
    RewardOutputError,
    load_reward_fn,
    register_reward,
)

FNS = "tests.rewards.reward_fns"


def test_builtins():
    assert REWARD_FNS.names() == ["format", "math"]
    math_fn = load_reward_fn("math")
    scores = math_fn(["The answer is 18.", "#### 19", r"\boxed{2\sqrt{2}}"], ["#### 18", "#### 18", r"\sqrt{8}"])
    assert scores == [1.0, 0.0, 1.0]
    stats = math_fn.pop_stats()
    assert (stats.total, stats.in_process, stats.sandboxed) == (3, 1, 2)  # "#### 19" is decided in-process
    assert math_fn.pop_stats().total == 0
    fmt = load_reward_fn("format")
    stated = [r"\boxed{3}", "#### 3", "The answer is 3", "Final answer: $3$"]
    unstated = ["maybe 3", r"\boxed{}", "####\n", "the answer is."]
    assert fmt(stated + unstated, [""] * 8) == [1.0] * 4 + [0.0] * 4


def test_user_functions_by_path_and_callable():
    per_sample = load_reward_fn(f"{FNS}:length_reward")
    assert per_sample(["ab", "x" * 50], ["", ""]) == [2.0, 10.0]
    assert per_sample.stats.total == 2
    batched = load_reward_fn(f"{FNS}:batched_length_reward")  # marked with @batched_reward
    assert batched.entry.batched and batched(["abc", ""], ["", ""]) == [3.0, 0.0]
    assert load_reward_fn(lambda r, ref: r == ref)(["a", "b"], ["a", "a"]) == [1.0, 0.0]  # bools count
    assert load_reward_fn(lambda rs, refs: np.ones(len(rs)), batched=True)(["a", "b"], ["", ""]) == [1.0, 1.0]
    assert load_reward_fn(lambda rs, refs: torch.zeros(len(rs)), batched=True)(["a"], [""]) == [0.0]


def test_registering_and_unknown_names():
    @register_reward("test_constant_reward")
    def constant(response: str, reference: str) -> float:
        return 0.25

    assert load_reward_fn("test_constant_reward")(["a"], ["b"]) == [0.25]
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_constant_reward")(constant)
    with pytest.raises(KeyError, match="unknown reward function 'maths'; valid names: format, math"):
        load_reward_fn("maths")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_pkg.rewards:fn", "cannot import module 'no_such_pkg.rewards'"),
        (f"{FNS}:missing", f"module '{FNS}' has no attribute 'missing'"),
        (f"{FNS}:NOT_CALLABLE", "is a int, not a function"),
        (f"{FNS}:", "must look like 'package.module:function'"),
    ],
)
def test_load_errors_are_clear(spec: str, message: str):
    with pytest.raises(RewardLoadError, match=message) as info:
        load_reward_fn(spec)
    assert isinstance(info.value, ImportError) and isinstance(info.value, RewardFunctionError)


@pytest.mark.parametrize(
    ("spec", "batched", "message"),
    [
        (f"{FNS}:string_reward", None, r"returned str '1.0' for sample 0; expected a float"),
        (f"{FNS}:nan_reward", None, r"returned nan for sample 0"),
        (f"{FNS}:short_batch_reward", True, r"returned 1 scores for 2 samples"),
        (f"{FNS}:length_reward", True, r"returned float 2.0; expected a sequence of 2 floats"),
    ],
)
def test_wrong_outputs_are_clear(spec: str, batched: bool | None, message: str):
    fn = load_reward_fn(spec, batched=batched)
    with pytest.raises(RewardOutputError, match=message) as info:
        fn(["", ""], ["", ""])
    assert isinstance(info.value, TypeError)


def test_tensor_output_hint_and_length_mismatch():
    fn = load_reward_fn(lambda r, ref: torch.tensor(1.0))
    with pytest.raises(RewardOutputError, match=r"use \.item\(\)"):
        fn(["a"], ["a"])
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        fn(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="registered with batched=True"):
        load_reward_fn("math", batched=False)
