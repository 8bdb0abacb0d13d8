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


def test_reversed_answers_and_padded_operands():
    task = ArithmeticTask(digits=2, reverse_answer=True, pad_operands=True)
    assert task.text(7, "+", 12) == "07+12=" and task.answer(7, "+", 12) == "91"
    assert task.answer(95, "+", 17) == "211" and task.answer(50, "-", 50) == "0"
    assert task.write("-120") == "-021"
    for ex in task.sample("test", 100, seed=2):
        a, op, b = task.parse(ex["prompt"])
        assert len(ex["prompt"]) == 6  # two 2-digit operands, the operator and '='
        assert ex["answer"][::-1] == ArithmeticTask.solve(a, op, b)
    # The split of a problem does not depend on how it is written.
    plain = ArithmeticTask(digits=2)
    assert {task.parse(e["prompt"]) for e in task.sample("test", 50, seed=4)} == {
        plain.parse(e["prompt"]) for e in plain.sample("test", 50, seed=4)}


def test_slip_forgets_every_carry_and_borrow():
    assert ArithmeticTask.slip(18, "+", 5) == "13"   # 8+5 = 13: the 1 is not carried
    assert ArithmeticTask.slip(95, "+", 17) == "2"   # 5+7 -> 2, 9+1 -> 0
    assert ArithmeticTask.slip(12, "+", 7) == "19"   # no carry: the right answer
    assert ArithmeticTask.slip(52, "-", 17) == "45"  # 2-7 -> 5 without borrowing, 5-1 -> 4
    assert ArithmeticTask.slip(3, "-", 8) == "-5"
    with pytest.raises(ValueError, match="slip"):
        ArithmeticTask.slip(3, "*", 4)


def test_parse_reads_back_every_prompt_form():
    assert ArithmeticTask.parse("12+7=") == (12, "+", 7)
    assert ArithmeticTask.parse("07-03=") == (7, "-", 3)
    assert ArithmeticTask.parse("3*40=") == (3, "*", 40)
    with pytest.raises(ValueError, match="not an arithmetic prompt"):
        ArithmeticTask.parse("hello")


def test_demonstrations_replace_answers_with_slips_at_the_rate():
    task = ArithmeticTask(digits=2, operators=("+",), reverse_answer=True)
    problems = task.sample("train", 1000, seed=0)
    assert task.demonstrations(problems, 0.0) == problems
    all_slips = task.demonstrations(problems, 1.0)
    assert [d["answer"] for d in all_slips] == [task.write(task.slip(*task.parse(p["prompt"]))) for p in problems]
    half = task.demonstrations(problems, 0.5, seed=1)
    assert half == task.demonstrations(problems, 0.5, seed=1)
    changed = sum(d != p for d, p in zip(half, problems))
    could = sum(s != p for s, p in zip(all_slips, problems))
    assert 0.4 * could < changed < 0.6 * could
    with pytest.raises(ValueError, match="slip_rate"):
        task.demonstrations(problems, 1.2)
