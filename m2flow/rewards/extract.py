"""Find the final answer inside a model response or a reference solution.

Order of preference, strongest signal first: the last ``\\boxed{...}`` (or ``\\fbox``), the last
``#### ...`` line (GSM8K's format), the last "the answer is ..." / "answer: ..." phrase, and at
last the last number in the text. Every step is a linear scan: this runs in the caller's process
on untrusted text, so nothing here may backtrack or allocate in proportion to anything but the
input length.
"""

from __future__ import annotations

import re
from typing import Literal

AnswerSource = Literal["boxed", "hashes", "phrase", "last_number"]

_BOXED = re.compile(r"\\(?:boxed|fbox)")
# "The answer is 42", "Final answer: 42", "Answer: 42"; case-insensitive, the last one wins.
_MAX_BOX_TRIES = 4
_PHRASE = re.compile(r"\b(?:final\s+answer|the\s+answer|answer)\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)
# A plain number as people write it: sign, thousands commas, decimals.
_NUMBER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-\u2212]?\.\d+")


def _read_braced(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``text[start] == '{'``; None if it never closes."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character (\{, \}) neither opens nor closes a group
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None  # unbalanced: the response was cut off inside the box


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (nested braces kept), or None."""
    # Only the last few boxes are tried: a flood of unclosed "\\boxed{" would otherwise make this
    # quadratic in the response length.
    for match in list(_BOXED.finditer(text))[::-1][:_MAX_BOX_TRIES]:
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            content = _read_braced(text, i)
            if content is not None and content.strip():
                return content.strip()
        elif i > match.end():
            # "\\boxed 5": without braces the argument is the next token.
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
        # This occurrence is unusable (cut off or empty); try the one before it.
    return None


def extract_hashes(text: str) -> str | None:
    """Text after the last ``####`` up to the end of its line (GSM8K's format), or None."""
    pos = text.rfind("####")
    if pos < 0:
        return None
    line = text[pos + 4 :].split("\n", 1)[0].strip()
    return line or None


def extract_phrase(text: str) -> str | None:
    """What follows the last "the answer is" / "answer:" on its line, or None."""
    last = None
    for last in _PHRASE.finditer(text):
        pass
    if last is None:
        return None
    line = text[last.end() :].split("\n", 1)[0].strip()
    # A sentence end closes the answer ("The answer is 42. Next we..."), a decimal point does not.
    sentence_end = re.search(r"\.(?:\s|$)", line)
    if sentence_end:
        line = line[: sentence_end.start()]
    return line.strip() or None


def extract_last_number(text: str) -> str | None:
    """The last number written in the text (with sign, commas and decimals), or None."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return last.group(0) if last else None


def extract_answer_with_source(text: str) -> tuple[str | None, AnswerSource | None]:
    """The final answer of a response and which rule found it; (None, None) when there is none."""
    for source, rule in (
        ("boxed", extract_boxed),
        ("hashes", extract_hashes),
        ("phrase", extract_phrase),
        ("last_number", extract_last_number),
    ):
        found = rule(text)
        if found:
            return found, source  # type: ignore[return-value]
    return None, None


def extract_answer(text: str) -> str | None:
    """The final answer of a response (boxed, ####, phrase, last number), or None."""
    return extract_answer_with_source(text)[0]


def reference_answer(reference: str) -> str:
    """The answer part of a reference: GSM8K's ``... #### N`` solution, a boxed one, or itself."""
    if "####" in reference:
        found = extract_hashes(reference)
        if found:
            return found
    if "\\boxed" in reference or "\\fbox" in reference:
        found = extract_boxed(reference)
        if found:
            return found
    return reference.strip()
