"""The synthetic arithmetic task: correct answers, disjoint splits, determinism."""

from __future__ import annotations

import pytest

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET, ArithmeticTask


def _solve(prompt: str) -> int:
    expr = prompt.rstrip("=")
    for op in "+*":
        if op in expr:
            a, b = expr.split(op)
            return int(a) + int(b) if op == "+" else int(a) * int(b)
    a, b = expr.split("-")
    return int(a) - int(b)


def test_answers_are_right_and_use_the_alphabet():
    task = ArithmeticTask(digits=2, operators=("+", "-", "*"))
    for ex in task.sample("train", 300, seed=1):
        assert int(ex["answer"]) == _solve(ex["prompt"])
        assert int(ex["answer"]) >= 0  # allow_negative=False orders subtraction operands
        assert set(ex["prompt"] + ex["answer"]) <= set(ARITHMETIC_ALPHABET)
    assert ArithmeticTask.prompt(12, "+", 7) == "12+7=" and ArithmeticTask.solve(12, "+", 7) == "19"


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_splits_never_overlap(digits):
    task = ArithmeticTask(digits=digits, heldout_fraction=0.2)
    n = 15 if digits == 1 else 200
    train = {ex["prompt"] for ex in task.sample("train", n * 4, seed=0)}
    test = {ex["prompt"] for ex in task.sample("test", n, seed=1)}
    assert len(test) == n  # unique=True
    assert not train & test


def test_all_one_digit_problems_partition():
    task = ArithmeticTask(digits=1, operators=("+",), heldout_fraction=0.3)
    splits = [task.split_of(a, "+", b) for a in range(10) for b in range(10)]
    assert 0 < splits.count("test") < 100
    assert len(task.sample("train", splits.count("train"))) == splits.count("train")
    with pytest.raises(ValueError, match="only"):
        task.sample("test", splits.count("test") + 1)


def test_seeded_and_deterministic():
    task = ArithmeticTask(digits=4)  # large space: rejection sampling path
    assert task.sample("train", 50, seed=7) == task.sample("train", 50, seed=7)
    assert task.sample("train", 50, seed=7) != task.sample("train", 50, seed=8)


def test_invalid_settings():
    with pytest.raises(ValueError, match="unknown operator"):
        ArithmeticTask(operators=("/",))
    with pytest.raises(ValueError, match="heldout_fraction"):
        ArithmeticTask(heldout_fraction=0.0)
