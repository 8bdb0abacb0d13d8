"""Decide whether two answers are equal: exactly as numbers, or symbolically with sympy.

The numeric comparison is exact (fractions) with one allowance: a decimal with at least two digits
after the point matches a value that has no finite decimal expansion when it is within one unit
of its last digit (0.33 or 0.333 for 1/3). Integers never get a tolerance, so N and N+1 differ
however large N is.

The symbolic comparison parses LaTeX-ish text into sympy. It may be slow or hang on pathological
input (huge powers, deep nesting), so callers run it under a time limit (see ``sandbox.py``).
``sympy.parse_expr`` evaluates Python, so the text is first reduced to a whitelist of characters
and names; anything else is refused rather than parsed.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from fractions import Fraction

from m2flow.rewards.normalize import ParsedNumber, normalize_answer, parse_number

MAX_EXPRESSION_CHARS = 400
_ALLOWED_CHARS = re.compile(r"[0-9A-Za-z+\-*/().,= ]*")
_FUNCTIONS = {"sqrt", "log", "exp", "sin", "cos", "tan", "pi", "oo", "E", "I"}
_LATEX_NAMES = {
    "\\cdot": "*",
    "\\times": "*",
    "\\div": "/",
    "\\pi": "pi",
    "\\infty": "oo",
    "\\ln": "log",
    "\\log": "log",
    "\\exp": "exp",
    "\\sin": "sin",
    "\\cos": "cos",
    "\\tan": "tan",
}
_LATEX_NAME = re.compile(r"\\[A-Za-z]+")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _terminates(value: Fraction) -> bool:
    """Whether ``value`` has a finite decimal expansion (denominator of only 2s and 5s)."""
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return den == 1


def _readings(n: ParsedNumber) -> Iterator[tuple[Fraction, int | None]]:
    """The values a number may stand for: itself, and for "50%" also 0.5."""
    yield n.value, n.decimals
    if n.percent:
        yield n.value / 100, None if n.decimals is None else n.decimals + 2


def _rounded_match(decimal: tuple[Fraction, int | None], other: Fraction) -> bool:
    value, decimals = decimal
    if decimals is None or decimals < 2 or _terminates(other):
        return False
    return abs(value - other) < Fraction(1, 10**decimals)


def numbers_match(a: ParsedNumber, b: ParsedNumber) -> bool:
    """Exact equality of two parsed numbers, percent-aware, with the rounded-decimal allowance."""
    for x in _readings(a):
        for y in _readings(b):
            if x[0] == y[0] or _rounded_match(x, y[0]) or _rounded_match(y, x[0]):
                return True
    return False


def _read_group(text: str, i: int) -> tuple[str, int] | None:
    """The argument starting at ``text[i]``: a {...} group or one character; and the index after it."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        return text[i], i + 1
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j], j + 1
    return None


def _expand_commands(text: str) -> str | None:
    """Rewrite \\frac{a}{b} and \\sqrt[n]{x} into plain parenthesised arithmetic, innermost last."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("\\frac", i):
            num = _read_group(text, i + 5)
            den = _read_group(text, num[1]) if num else None
            if num is None or den is None:
                return None
            a, b = _expand_commands(num[0]), _expand_commands(den[0])
            if a is None or b is None:
                return None
            out.append(f"(({a})/({b}))")
            i = den[1]
        elif text.startswith("\\sqrt", i):
            j, index = i + 5, "2"
            if j < len(text) and text[j] == "[":
                close = text.find("]", j)
                if close < 0:
                    return None
                index, j = text[j + 1 : close], close + 1
            arg = _read_group(text, j)
            if arg is None:
                return None
            inner, root = _expand_commands(arg[0]), _expand_commands(index)
            if inner is None or root is None:
                return None
            out.append(f"(({inner})**(1/({root})))")
            i = arg[1]
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def to_sympy_string(text: str) -> str | None:
    """Plain arithmetic text for sympy from a LaTeX-ish answer; None if it uses anything unsupported."""
    text = normalize_answer(text)
    if "=" in text:
        text = text.rsplit("=", 1)[1]  # an equation's value is its right-hand side
    text = _expand_commands(text)
    if text is None:
        return None
    if any(name not in _LATEX_NAMES for name in _LATEX_NAME.findall(text)):
        return None  # a LaTeX command we do not understand: better no answer than a wrong one
    text = _LATEX_NAME.sub(lambda m: f" {_LATEX_NAMES[m.group(0)]} ", text)
    text = text.replace("{", "(").replace("}", ")").replace("^", "**").strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(text):
        return None
    for name in _IDENTIFIER.findall(text):
        # Short letter runs become products of symbols ("xy" -> x*y); anything that names a
        # Python builtin is refused because parse_expr evaluates the string.
        if name not in _FUNCTIONS and (len(name) > 3 or not name.isalpha() or hasattr(builtins, name)):
            return None
    return text


def _split_top_level(text: str) -> list[str]:
    """Split "1, (2, 3)" on commas outside brackets: the parts of a tuple or list answer."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def to_sympy(text: str):  # noqa: ANN201 - returns a sympy expression; sympy is imported lazily
    """A sympy expression for an answer, or None when it cannot be parsed safely."""
    from sympy import E, I, pi
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    source = to_sympy_string(text)
    if source is None:
        return None
    transformations = standard_transformations + (implicit_multiplication_application, convert_xor)
    # In a final answer "e" and "i" almost always mean Euler's number and the imaginary unit.
    local = {"e": E, "pi": pi, "I": I, "i": I}
    try:
        return parse_expr(source, local_dict=local, transformations=transformations, evaluate=True)
    except Exception:  # noqa: BLE001 - any parse failure means "not comparable"
        return None


def _expressions_equal(pred, ref, decimals: int | None) -> bool:  # noqa: ANN001 - sympy objects
    import sympy

    diff = sympy.simplify(pred - ref)
    if diff == 0:
        return True
    if pred.is_number and ref.is_number:
        gap = abs(complex(sympy.N(diff, 30)))
        if decimals is not None and decimals >= 2:
            return gap < 10.0**-decimals
        return gap <= 1e-9 * max(1.0, abs(complex(sympy.N(ref, 30))))
    return bool(pred.equals(ref))


def _decimals_of(text: str) -> int | None:
    parsed = parse_number(text)
    return parsed.decimals if parsed is not None else None


def _parts(text: str) -> tuple[str, list[str]]:
    """Brackets and elements of a tuple/interval answer: "(1, 2)" -> ("()", ["1", "2"]), "7" -> ("", ["7"])."""
    text = normalize_answer(text)
    parts = _split_top_level(text)
    if len(parts) == 1 and text[:1] in "([" and text[-1:] in ")]":
        inner = _split_top_level(text[1:-1])
        if len(inner) > 1:
            return text[0] + text[-1], inner
    return "", parts


def symbolic_equal(pred: str, ref: str) -> bool:
    """Whether two answers are the same value or expression (tuples compared element-wise)."""
    (pred_brackets, pred_parts), (ref_brackets, ref_parts) = _parts(pred), _parts(ref)
    # "[1, 3]" and "(1, 3)" are different intervals; a bare "1, 3" matches either.
    if pred_brackets and ref_brackets and pred_brackets != ref_brackets:
        return False
    if len(pred_parts) != len(ref_parts):
        return False
    for p, r in zip(pred_parts, ref_parts):
        if p == r:
            continue
        ep, er = to_sympy(p), to_sympy(r)
        if ep is None or er is None:
            return False
        decimals = _decimals_of(p) if _decimals_of(p) is not None else _decimals_of(r)
        try:
            if not _expressions_equal(ep, er, decimals):
                return False
        except (TypeError, ValueError, ArithmeticError, AttributeError):
            return False
    return True
