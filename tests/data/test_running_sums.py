"""The running-sums task: right answers, disjoint splits, the teacher's slip, a long tail of lengths."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.data.running_sums import FILLER, RUNNING_SUMS_ALPHABET, RunningSumsTask


def _sums(prompt: str) -> str:
    """The running sums of a prompt, computed the long way round: each prefix summed anew."""
    digits = [int(c) for c in prompt if c.isdigit()]
    return "".join(str(sum(digits[: i + 1]) % 10) for i in range(len(digits)))


def test_answers_are_the_running_sums_mod_10_at_a_fixed_width():
    task = RunningSumsTask(max_steps=24)
    assert task.prompt([3, 1, 4]) == "314" + FILLER * 21 + "=" and task.solve([3, 1, 4]) == "348"
    assert task.solve([9, 9, 9]) == "987"
    for ex in task.sample("train", 300, seed=1):
        assert ex["answer"] == _sums(ex["prompt"])
        assert len(ex["prompt"]) == 25  # every digit sits at a fixed position
        assert set(ex["prompt"] + ex["answer"]) <= set(RUNNING_SUMS_ALPHABET)
        assert task.parse(ex["prompt"]) == [int(c) for c in ex["prompt"].rstrip("=").rstrip(FILLER)]


def test_splits_never_overlap_and_are_seeded():
    task = RunningSumsTask(max_steps=8, heldout_fraction=0.2)
    train = {ex["prompt"] for ex in task.sample("train", 2000, seed=0)}
    test = {ex["prompt"] for ex in task.sample("test", 500, seed=1)}
    assert len(test) > 100 and not train & test
    assert all(task.split_of(task.parse(p)) == "test" for p in test)
    assert task.sample("train", 50, seed=7) == task.sample("train", 50, seed=7)
    assert task.sample("train", 50, seed=7) != task.sample("train", 50, seed=8)


def test_response_lengths_spread_tenfold_within_a_batch_of_32():
    """Answer + end of sequence: most batches hold a 1-step prompt (2 tokens) and one of 19+ steps (20+)."""
    task = RunningSumsTask()  # 1..24 steps, P(k) ~ 1/k
    lengths = np.array([len(ex["answer"]) + 1 for ex in task.sample("train", 3200, seed=0)])
    batches = lengths.reshape(100, 32)
    spread = batches.max(axis=1) / batches.min(axis=1)
    assert np.mean(spread >= 10) > 0.8, np.median(spread)
    assert np.median(lengths) <= 6 and lengths.max() == 25  # most short, a few long


def test_the_teacher_skips_the_digits_that_wrap_the_sum_at_its_slip_rate():
    assert RunningSumsTask.slip([3, 8, 4]) == "337"  # 3 + 8 would pass 9: skipped, the sum stays 3
    assert RunningSumsTask.slip([1, 2, 3]) == RunningSumsTask.solve([1, 2, 3])  # nothing wraps: no slip
    task = RunningSumsTask(max_steps=6)
    problems = task.sample("train", 2000, seed=0)
    slipped = task.demonstrations(problems, slip_rate=0.5, seed=0)
    can_slip = [task.slip(task.parse(p["prompt"])) != p["answer"] for p in problems]
    wrong = [d["answer"] != p["answer"] for d, p in zip(slipped, problems)]
    assert not any(w and not c for w, c in zip(wrong, can_slip))  # only a wrapping problem comes out wrong
    assert 0.4 * sum(can_slip) < sum(wrong) < 0.6 * sum(can_slip)
    assert all(d["answer"] == p["answer"] for d, p in zip(task.demonstrations(problems, 0.0), problems))


@pytest.mark.parametrize("kwargs,message", [
    ({"max_steps": 0}, "max_steps must be >= 1"),
    ({"length_tail": -1.0}, "length_tail must be >= 0"),
    ({"heldout_fraction": 1.0}, "heldout_fraction must be in"),
])
def test_bad_settings_fail_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RunningSumsTask(**kwargs)


def test_bad_calls_fail_clearly():
    task = RunningSumsTask(max_steps=4)
    with pytest.raises(ValueError, match="1..4 digits"):
        task.prompt([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="slip_rate"):
        task.demonstrations([], slip_rate=1.5)
    with pytest.raises(ValueError, match="split"):
        task.sample("valid", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a running-sums prompt"):
        task.parse("12+7=")
    with pytest.raises(ValueError, match="too few problems"):  # 1 step: 10 problems, too few for a 0.1% split
        RunningSumsTask(max_steps=1, heldout_fraction=0.001).sample("test", 1)
