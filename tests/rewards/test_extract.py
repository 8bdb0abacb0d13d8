"""Finding the final answer in responses and references."""

from __future__ import annotations

import pytest

from m2flow.rewards.extract import (
    extract_answer,
    extract_answer_with_source,
    extract_boxed,
    reference_answer,
)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (r"so the result is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}} and later \boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),  # last box, nested braces
        (r"\boxed{ {a} + \{b\} }", r"{a} + \{b\}"),  # escaped braces do not close the box
        (r"\fbox{7}", "7"),
        (r"\boxed 5 done", "5"),
        (r"first \boxed{3} then a cut-off \boxed{4", "3"),  # unclosed last box: fall back
    ],
)
def test_boxed(text: str, answer: str):
    assert extract_boxed(text) == answer


@pytest.mark.parametrize(
    ("text", "answer", "source"),
    [
        ("She sells 9 eggs.\n#### 18", "18", "hashes"),
        ("Working...\n#### 1,080\nextra", "1,080", "hashes"),
        ("So the answer is 3.5. Next question", "3.5", "phrase"),
        ("The answer is: $18.", "$18", "phrase"),
        ("Final answer: 12 apples", "12 apples", "phrase"),
        ("We get 3 then 4, so 7 in all", "7", "last_number"),
        ("It costs -1,250.75 dollars", "-1,250.75", "last_number"),
        (r"#### 5 but really \boxed{6}", "6", "boxed"),  # the box is the strongest signal
        ("no digits here", None, None),
    ],
)
def test_answer_sources_in_order(text: str, answer: str | None, source: str | None):
    assert extract_answer_with_source(text) == (answer, source)


def test_reference_formats():
    assert reference_answer("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    assert reference_answer(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert reference_answer("  42 ") == "42"


def test_flood_of_unclosed_boxes_is_linear_enough():
    text = "\\boxed{" * 20000 + " 5"
    assert extract_answer(text) == "5"  # falls through to the last number
