"""Exact arithmetic on a parsed expression tree: the calculator tool, with no ``eval`` of any Python.

The argument is read with ``ast.parse(..., mode="eval")`` and only these nodes are evaluated: integer and
float literals, unary ``+``/``-`` and binary ``+ - * / // % **``, with parentheses. Names, calls,
attributes, strings, comparisons or anything else raise ``CalculatorError`` naming the node. Integers stay
exact (Python integers); bounds keep one call cheap: at most ``MAX_CHARS`` characters, exponents up to
``MAX_EXPONENT`` and results up to ``MAX_DIGITS`` digits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value is out of bounds."""


def _check(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    magnitude = abs(value)
    if magnitude >= 10**MAX_DIGITS:
        raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponents are limited to {MAX_EXPONENT}")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is out of range") from None
    raise CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, e.g. ``evaluate("123*456") == 56088``."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expressions are limited to {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot read {expression[:60]!r} as arithmetic") from None
    return _eval(tree)


def format_number(value: int | float) -> str:
    """An integer as is; a float with 10 significant digits, integral floats without a fraction ('2.0' -> '2')."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".10g")
    return str(value)


class Calculator:
    """The ``calculator`` tool: ``<tool>calculator: 123*456</tool>`` -> ``56088``."""

    name = "calculator"
    description = "exact arithmetic: numbers, + - * / // % ** and parentheses"
    parameters = {"type": "object", "required": ["expression"], "properties": {
        "expression": {"type": "string", "description": "an arithmetic expression, e.g. 123*456"}}}
    isolated = False

    def __call__(self, argument: str) -> str:
        return format_number(evaluate(argument))
