"""Math answer verification: is the final answer of a response equal to the reference answer?

Two tiers. ``quick_verify`` does string and exact-number work only (bounded, microseconds) and
decides most cases, all of GSM8K among them. What it cannot decide (expressions such as
``2\\sqrt{2}`` or ``\\frac{\\pi}{3}``) goes to ``verify_symbolic``, which uses sympy and must be
run under a time limit; ``sandbox.score_batch`` does both.

References may be a bare answer ("42", "\\frac{1}{2}"), a boxed one, or a GSM8K solution ending in
``#### 42``.
"""

from __future__ import annotations

import functools

from m2flow.rewards.compare import numbers_match, symbolic_equal
from m2flow.rewards.extract import extract_answer, reference_answer
from m2flow.rewards.normalize import ParsedNumber, normalize_answer, parse_normalized_number


@functools.lru_cache(maxsize=4096)
def _reference(reference: str) -> tuple[str, ParsedNumber | None]:
    """Normalised answer and number of a reference; cached because a group shares its reference."""
    answer = normalize_answer(reference_answer(reference))
    return answer, parse_normalized_number(answer)


def quick_verify(response: str, reference: str) -> bool | None:
    """True/False when string and exact-number checks decide; None when sympy is needed."""
    pred = extract_answer(response)
    if pred is None:
        return False
    pred_norm = normalize_answer(pred)
    ref_norm, ref_num = _reference(reference)
    if pred_norm and pred_norm.replace(" ", "") == ref_norm.replace(" ", ""):
        return True
    pred_num = parse_normalized_number(pred_norm)
    if pred_num is not None and ref_num is not None:
        return numbers_match(pred_num, ref_num)
    if not pred_norm or not ref_norm:
        return False
    return None


def verify_symbolic(response: str, reference: str) -> bool:
    """Full check including sympy; may be slow on pathological input: run it under a time limit."""
    decided = quick_verify(response, reference)
    if decided is not None:
        return decided
    pred = extract_answer(response)
    assert pred is not None  # quick_verify returned None, so an answer was found
    return symbolic_equal(pred, reference_answer(reference))


def math_score(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0 (no time limit)."""
    return 1.0 if verify_symbolic(response, reference) else 0.0
