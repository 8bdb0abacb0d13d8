"""Math answer verification: does a response's final answer equal the reference? Decided by math-verify.

Hugging Face's ``math-verify`` library (imported as ``math_verify``; this module's absolute name is
``m2flow.rewards.math_verify``, so the two never shadow each other) finds the final answer of a
text (``\\boxed{}``, "the final answer is", LaTeX in ``$...$``/``\\(...\\)``/``\\[...\\]``, plain
numbers and expressions), normalises its LaTeX (``\\dfrac``, ``\\left(``, units in ``\\text{}``,
thousands separators) and compares values: numbers, fractions, percentages, sets, intervals,
equations, symbolic equality through sympy. On top of it m2flow reads:

- GSM8K's convention: when a text has a ``####`` marker, what follows the last one is its answer
  (the library knows no such anchor and would read a GSM8K solution at its last number);
- a reference without math delimiters (``\\frac13``, ``(1, 2]``, ``x = 3``) as LaTeX, as if it were
  written inside ``$...$``;
- ``quick_verify``: when both answers are plain integers (``18``, ``#### 1,080``, a lone
  ``\\boxed{18}``), their values decide without parsing. It is tested to agree with the library on
  every GSM8K answer and on a set of LaTeX forms.

The library's own time limits are turned off. They use ``signal.alarm``, which raises outside the
main thread, counts whole seconds and cannot stop a long computation inside C code (a huge integer
power). ``verify_answer`` therefore has no time limit of its own and must run under one:
``sandbox.score_batch`` runs it in worker processes that are killed at their deadline.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Answers are looked for as LaTeX first, then as plain numbers and expressions (the library's default).
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
# An integer as GSM8K writes it: optional minus, digits or comma-grouped thousands. At most 15 digits,
# which is what the library's comparison resolves without rounding (numeric_precision=15).
_PLAIN_INTEGER = re.compile(r"-?(?:\d{1,15}|\d{1,3}(?:,\d{3}){1,4})")
# A \boxed{} with no braces inside it.
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# A "$" not written as "\$" (a dollar amount) opens LaTeX; so do these.
_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\boxed|\\fbox|\\\(|\\\[")


class _TimeoutsAreOurs(logging.Filter):
    """Drops the library's warning that its time limit is off: the sandbox's deadline replaces it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutsAreOurs())


def answer_text(text: str) -> str:
    """The part of a text that states its answer: after the last ``####`` if there is one, else all of it."""
    marker = text.rfind("####")
    return text[marker + 4 :].strip() if marker >= 0 else text


def plain_integer(text: str) -> int | None:
    """The value of a text that is nothing but an integer ("18", "-3", "1,080"), else None."""
    text = text.strip()
    if not _PLAIN_INTEGER.fullmatch(text):
        return None
    return int(text.replace(",", ""))


def stated_integer(response: str) -> int | None:
    """The response's answer when the library would read it as a plain integer without parsing LaTeX.

    That is the answer text itself (``18``, ``#### 1,080``), or the content of its only ``\\boxed{}``
    when nothing else could take precedence: the library reads a box first unless the text says
    "final answer", and the box is the whole answer when no math delimiter, bracket or later brace
    surrounds it.
    """
    text = answer_text(response)
    value = plain_integer(text)
    if value is not None or "\\boxed" not in text:
        return value
    box = _BOXED.search(text)
    if (
        box is None
        or text.count("\\boxed") != 1
        or "}" in text[box.end() :]
        or any(mark in text for mark in ("$", "\\(", "\\[", "["))
        or "final answer" in text.lower()
    ):
        return None
    return plain_integer(box.group(1))


def _parse(text: str) -> list[Any]:
    """The library's reading of a text: [value, extracted string] or [] (timeouts off, see module doc)."""
    return parse(text, extraction_config=_EXTRACTION, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def parse_reference(reference: str) -> tuple[Any, ...]:
    """The parsed reference answer; cached because every response of a group shares its reference.

    Read forms: a GSM8K solution (``... #### 1,080``), a bare answer (``42``, ``\\frac{1}{2}``,
    ``(1, 2]``, ``x = 3``, ``50\\%``), or LaTeX in ``$...$``, ``\\(...\\)``, ``\\[...\\]`` or ``\\boxed{}``.
    """
    answer = answer_text(reference).strip()
    if not _MATH_DELIMITER.search(answer):
        answer = f"${answer}$"
    return tuple(_parse(answer))


def parse_response(response: str) -> list[Any]:
    """The parsed final answer of a response ([] when none is found)."""
    return _parse(answer_text(response))


def quick_verify(response: str, reference: str) -> bool | None:
    """The verdict when both answers are plain integers (bounded regular expressions); None otherwise."""
    ref = plain_integer(answer_text(reference))
    if ref is None:
        return None
    pred = stated_integer(response)
    if pred is None:
        return None
    return pred == ref


def library_verify(response: str, reference: str) -> bool:
    """math-verify's verdict, without the fast path; no time limit: run it in the sandbox."""
    gold = parse_reference(reference)
    if not gold:
        return False
    return verify(list(gold), parse_response(response), timeout_seconds=None)


def verify_answer(response: str, reference: str) -> bool:
    """Whether the response's final answer equals the reference; no time limit: run it in the sandbox."""
    decided = quick_verify(response, reference)
    return decided if decided is not None else library_verify(response, reference)


def math_score(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0 (no time limit)."""
    return 1.0 if verify_answer(response, reference) else 0.0
