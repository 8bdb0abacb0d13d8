"""Math verification end to end, including every GSM8K reference answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m2flow.rewards.extract import reference_answer
from m2flow.rewards.math_verify import math_score, quick_verify, verify_symbolic

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k"


@pytest.mark.parametrize(
    ("response", "reference", "decided"),
    [
        ("The answer is 18.", "Janet sells 9 eggs.\n#### 18", True),
        (r"Thus \boxed{1,080} dollars", "#### 1080", True),
        (r"\boxed{\$18.00}", "18", True),
        ("I think 17", "#### 18", False),
        ("no answer at all", "18", False),
        (r"\boxed{0.5}", r"\frac{1}{2}", True),
        (r"\boxed{\frac{2}{4}}", "0.5", True),
        (r"\boxed{50\%}", "0.5", True),
    ],
)
def test_quick_verify_decides_plain_numbers(response: str, reference: str, decided: bool):
    assert quick_verify(response, reference) is decided


def test_symbolic_answers_are_left_to_sympy():
    assert quick_verify(r"\boxed{2\sqrt{2}}", r"\sqrt{8}") is None
    assert verify_symbolic(r"\boxed{2\sqrt{2}}", r"\sqrt{8}") is True
    assert math_score(r"so \boxed{\frac{\pi}{2}}", r"\dfrac{\pi}{2}") == 1.0
    assert math_score(r"so \boxed{\frac{\pi}{3}}", r"\dfrac{\pi}{2}") == 0.0


def test_adversarial_numbers_stay_cheap_in_process():
    # Must not build a 10**999999999 integer or a power tower in the caller's process.
    assert quick_verify(r"\boxed{1e999999999}", "1") is None
    assert quick_verify(r"\boxed{9^{9^{9^9}}}", "1") is None
    # Past MAX_NUMBER_CHARS the text is not parsed here (int() of >4300 digits even raises).
    assert quick_verify("9" * 5000, "1") is None


def _gsm8k_answers() -> list[tuple[str, str]]:
    rows = []
    for split in ("train", "test"):
        path = GSM8K / f"{split}.jsonl"
        if not path.exists():
            pytest.skip(f"GSM8K not found at {path}")
        with path.open() as f:
            rows += [json.loads(line)["answer"] for line in f if line.strip()]
    return [(solution, reference_answer(solution)) for solution in rows]


def test_every_gsm8k_reference_verifies_and_wrong_answers_never_do():
    answers = _gsm8k_answers()
    assert len(answers) == 7473 + 1319
    for solution, raw in answers:
        n = int(raw.replace(",", ""))
        # The raw reference itself, then re-formatted variants of the same number.
        right = [
            solution,
            raw,
            rf"so the total is \boxed{{{n}}}",
            rf"\boxed{{{n:,}}}",
            f"Therefore, the answer is {n:,}.",
            f"The answer is ${n}.",
            f"#### {n}",
            f"{n}.00 in all",
        ]
        for response in right:
            assert quick_verify(response, solution) is True, (response, raw)
        for wrong in {n + 1, n * 2 + 3, -n - 1} - {n}:  # 2n + 3 == n for n = -3
            for response in (rf"\boxed{{{wrong}}}", f"The answer is {wrong:,}.", f"#### {wrong}"):
                assert quick_verify(response, solution) is False, (response, raw)
