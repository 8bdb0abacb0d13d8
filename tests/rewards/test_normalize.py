"""Canonical answer strings and exact parsing of numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest

from m2flow.rewards.normalize import normalize_answer, parse_number


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,080", 1080),
        ("-5", -5),
        ("\u22125", -5),  # unicode minus
        ("$18.00", 18),
        (r"\$18", 18),
        ("18 dollars", 18),
        ("10 km/h", 10),
        ("5/hour", 5),
        (r"\text{5 apples}", 5),
        ("x = 5", 5),
        (r"\frac{1}{2}", Fraction(1, 2)),
        (r"\dfrac{3}{4}", Fraction(3, 4)),
        (r"\tfrac12", Fraction(1, 2)),
        (r"-\frac{3}{4}", Fraction(-3, 4)),
        ("3/4", Fraction(3, 4)),
        ("2 1/2 hours", Fraction(5, 2)),
        (".5", Fraction(1, 2)),
        ("1.50", Fraction(3, 2)),
        ("1e3", 1000),
        (r"1{,}000", 1000),
        (r"\left( 7 \right)", None),  # brackets around a number are not a plain number
        (r"90^\circ", 90),
        (r"12\,345", None),  # LaTeX thin space is not a thousands separator we guess at
    ],
)
def test_parse_number(text: str, value):
    parsed = parse_number(text)
    if value is None:
        assert parsed is None
    else:
        assert parsed is not None and parsed.value == value and not parsed.percent


def test_percent_and_decimals():
    p = parse_number(r"50\%")
    assert p is not None and p.value == 50 and p.percent
    assert parse_number("12.25 percent").percent
    assert parse_number("3.140").decimals == 3
    assert parse_number(r"\frac{1}{3}").decimals is None


@pytest.mark.parametrize("text", ["5x", "1,5", "5 + 3", "18 and 20", "1e9999", "", "abc", "2^{10}", "1" * 300])
def test_not_plain_numbers(text: str):
    assert parse_number(text) is None


def test_normalize_answer():
    assert normalize_answer(r"$\text{ 3 } \, cm$.") == "3 cm"
    assert normalize_answer(r"x = \left(1, 2\right)") == "(1, 2)"
    assert normalize_answer(r"\dfrac{1}{2}") == r"\frac{1}{2}"
    assert normalize_answer("**42**") == "42"
