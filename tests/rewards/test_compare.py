"""Exact numeric comparison and symbolic comparison with sympy."""

from __future__ import annotations

from fractions import Fraction

import pytest

from m2flow.rewards.compare import numbers_match, symbolic_equal, to_sympy_string
from m2flow.rewards.normalize import ParsedNumber, parse_number


def num(text: str) -> ParsedNumber:
    parsed = parse_number(text)
    assert parsed is not None, text
    return parsed


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("0.5", r"\frac{1}{2}", True),
        ("18", "18.00", True),
        ("1000000", "1000001", False),  # integers never get a tolerance
        ("123456789012", "123456789013", False),
        ("0.33", "1/3", True),  # rounded decimal of a non-terminating value
        ("0.333", "1/3", True),
        ("0.3", "1/3", False),  # one digit is too coarse
        ("0.13", "0.125", False),  # 0.125 has an exact decimal form: no rounding allowance
        ("0.67", "2/3", True),
        ("50%", "0.5", True),
        ("50%", "50", True),
        ("0.5", "50", False),
        ("-3", "3", False),
    ],
)
def test_numbers_match(a: str, b: str, equal: bool):
    assert numbers_match(num(a), num(b)) is equal
    assert numbers_match(num(b), num(a)) is equal


def test_exact_fractions_without_float_error():
    assert numbers_match(ParsedNumber(Fraction(1, 10) + Fraction(2, 10)), num("0.3"))


@pytest.mark.parametrize(
    ("pred", "ref", "equal"),
    [
        (r"2\sqrt{2}", r"\sqrt{8}", True),
        (r"\frac{\pi}{3}", r"\dfrac{\pi}{3}", True),
        (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", True),
        ("x^2+2x+1", "(x+1)^2", True),
        ("x^2+2x", "(x+1)^2", False),
        (r"\sqrt[3]{27}", "3", True),
        ("1.41", r"\sqrt{2}", True),  # decimal rounded to its last digit
        ("1.4", r"\sqrt{2}", False),
        (r"e^{i\pi}", "-1", True),
        ("(1, 2)", "(1,2)", True),
        ("(2, 1)", "(1,2)", False),
        ("[1, 3]", "(1, 3)", False),  # closed and open intervals differ
        ("y = 2x + 1", "2x+1", True),
        (r"3 \cdot 4", "12", True),
        (r"\unknowncommand{3}", "3", False),
    ],
)
def test_symbolic_equal(pred: str, ref: str, equal: bool):
    assert symbolic_equal(pred, ref) is equal


@pytest.mark.parametrize(
    "text",
    ['__import__("os").system("true")', "open(1)", "lambda: 1", "x.__class__", "exec(1)", "abs(-1)", "a_b"],
)
def test_unsafe_text_is_never_handed_to_sympy(text: str):
    assert to_sympy_string(text) is None
    assert symbolic_equal(text, "1") is False


def test_to_sympy_string():
    assert to_sympy_string(r"\frac{a}{b} + \sqrt{x}") == "((a)/(b)) + ((x)**(1/(2)))"
    assert to_sympy_string(r"2 \times \pi") == "2  *   pi"
