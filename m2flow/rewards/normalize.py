"""Bring an extracted answer to a canonical string and, when it is a number, to an exact value.

Numbers are parsed to ``fractions.Fraction`` so ``0.5``, ``1/2``, ``\\frac{1}{2}`` and ``50%`` of 1
compare exactly, without float rounding. Parsing is bounded: inputs longer than ``MAX_NUMBER_CHARS``
and exponents above three digits are refused, so an adversarial "1e999999999" cannot make the
caller allocate a huge integer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_NUMBER_CHARS = 200

# (pattern, replacement) applied in order; each removes notation that does not change the value.
_LATEX_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}", r" \1 "),
        (r"\\[dt]frac", r"\\frac"),
        (r"\\(?:left|right|displaystyle|big|Big|bigg|Bigg)(?![a-zA-Z])", ""),
        (r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\u00b0", ""),  # degrees
        (r"\\%", "%"),
        (r"\{,\}", ","),  # "1{,}000": LaTeX's way to stop a comma adding space
        (r"\\\$|\$", ""),
        (r"\\[,;:!> ]|\\q?quad|~", " "),  # LaTeX spacing
        (r"\\[()\[\]]", ""),  # inline/display math delimiters
        (r"\*\*", ""),  # markdown bold
        (r"[\u2212\u2013]", "-"),  # unicode minus and en dash
    )
)
# A leading "x =" or "n=": the value is on the right.
_LHS = re.compile(r"^\s*[A-Za-z]\w{0,15}\s*=\s*")
_SPACES = re.compile(r"\s+")
# The written number: sign, integer part with optional thousands commas, decimals, exponent.
_DECIMAL = re.compile(
    r"([-+]?)(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d+))?(?:[eE]([-+]?\d{1,3}))?(?![\d,.])"
)
_LATEX_FRAC = re.compile(r"(-?)\\frac\s*(?:\{\s*(-?\d+)\s*\}|(\d))\s*(?:\{\s*(-?\d+)\s*\}|(\d))")
_MIXED = re.compile(r"(-?)(\d+)\s+(\d+)\s*/\s*(\d+)")
_SLASH = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
# What may follow a number without changing it: a percent sign and/or words (units, "dollars").
# Words must be set off by a space (or a "/" as in "5/hour"): "5x" is an expression, not 5.
_TAIL = re.compile(r"\s*(%|percent\b)?(?:\s+[A-Za-z][A-Za-z\s/.\-]*|\s*/\s*[A-Za-z][A-Za-z\s/.\-]*)?\s*")


@dataclass(frozen=True)
class ParsedNumber:
    """An exact number read from text; ``decimals`` is set only when it was written as a decimal."""

    value: Fraction
    decimals: int | None = None
    percent: bool = False


_NOTATION_CHARS = frozenset("\\$~*{}\u00b0\u2212\u2013")


def clean_latex(text: str) -> str:
    """Strip LaTeX/markdown notation that does not change the value (spacing, $, \\text, \\left)."""
    if _NOTATION_CHARS.isdisjoint(text):
        return text  # the common plain answer ("18", "1,080"): nothing to rewrite
    for pattern, replacement in _LATEX_REWRITES:
        text = pattern.sub(replacement, text)
    return text


def normalize_answer(text: str) -> str:
    """Canonical string of an answer: LaTeX cleaned, no leading ``x =``, single spaces, no final dot."""
    text = clean_latex(text)
    text = _LHS.sub("", text, count=1)
    text = _SPACES.sub(" ", text).strip()
    return text.rstrip(".").strip()


def _tail_percent(tail: str) -> bool | None:
    """Whether the text after a number marks a percent; None if that text is not just units/words."""
    match = _TAIL.fullmatch(tail)
    if match is None:
        return None
    return match.group(1) is not None


def parse_number(text: str) -> ParsedNumber | None:
    """The exact value of an answer written as a number (decimal, fraction, \\frac, mixed, %), else None."""
    return parse_normalized_number(normalize_answer(text))


def parse_normalized_number(text: str) -> ParsedNumber | None:
    """``parse_number`` for text that already went through ``normalize_answer``."""
    if not text or len(text) > MAX_NUMBER_CHARS:
        return None
    for parse in (_parse_latex_frac, _parse_mixed, _parse_slash, _parse_decimal):
        parsed = parse(text)
        if parsed is not None:
            return parsed
    return None


def _parse_latex_frac(text: str) -> ParsedNumber | None:
    match = _LATEX_FRAC.match(text)
    if match is None:
        return None
    percent = _tail_percent(text[match.end() :])
    num, den = int(match.group(2) or match.group(3)), int(match.group(4) or match.group(5))
    if percent is None or den == 0:
        return None
    value = Fraction(num, den)
    return ParsedNumber(-value if match.group(1) else value, None, percent)


def _parse_mixed(text: str) -> ParsedNumber | None:
    match = _MIXED.match(text)
    if match is None:
        return None
    percent = _tail_percent(text[match.end() :])
    den = int(match.group(4))
    if percent is None or den == 0:
        return None
    value = int(match.group(2)) + Fraction(int(match.group(3)), den)
    return ParsedNumber(-value if match.group(1) else value, None, percent)


def _parse_slash(text: str) -> ParsedNumber | None:
    match = _SLASH.match(text)
    if match is None:
        return None
    percent = _tail_percent(text[match.end() :])
    den = Fraction(match.group(2))
    if percent is None or den == 0:
        return None
    return ParsedNumber(Fraction(match.group(1)) / den, None, percent)


def _parse_decimal(text: str) -> ParsedNumber | None:
    match = _DECIMAL.match(text)
    if match is None or (match.group(2) is None and match.group(3) is None):
        return None
    percent = _tail_percent(text[match.end() :])
    if percent is None:
        return None
    sign, integer, fraction, exponent = match.groups()
    whole = int((integer or "0").replace(",", "") + (fraction or ""))
    scale = len(fraction or "") - (int(exponent) if exponent else 0)
    value = Fraction(whole, 10**scale) if scale >= 0 else Fraction(whole * 10**-scale)
    if sign == "-":
        value = -value
    decimals = len(fraction) if fraction else 0
    if exponent:
        decimals = max(0, decimals - int(exponent))
    return ParsedNumber(value, decimals, percent)
