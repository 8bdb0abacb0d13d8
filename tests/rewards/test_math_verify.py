"""Math verification with math-verify: reference forms, LaTeX forms, and the fast path against the library."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from m2flow.rewards.math_verify import (
    answer_text,
    library_verify,
    math_score,
    parse_reference,
    plain_integer,
    quick_verify,
    stated_integer,
)
from tests.rewards.latex_forms import CASES, Case

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k"


def test_the_library_is_imported_not_this_module():
    import math_verify

    import m2flow.rewards.math_verify as ours

    assert ours.__name__ == "m2flow.rewards.math_verify"
    assert Path(math_verify.__file__).parent.name == "math_verify"  # the installed package
    assert "m2flow" not in Path(math_verify.__file__).parts
    assert ours.parse is math_verify.parse and ours.verify is math_verify.verify


@pytest.mark.parametrize(
    "reference",
    [
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18",
        "#### 18",
        "18",
        "18.0",
        "$18$",
        r"\boxed{18}",
        r"The answer is $\boxed{18}$.",
        r"\(18\)",
        r"18\text{ dollars}",
    ],
)
def test_reference_forms_that_are_read(reference: str):
    assert math_score("The answer is 18.", reference) == 1.0
    assert math_score("The answer is 19.", reference) == 0.0


@pytest.mark.parametrize(
    ("reference", "right", "wrong"),
    [
        (r"\frac13", r"$\dfrac{1}{3}$", r"$\frac{1}{4}$"),
        (r"$\frac{1}{3}$", r"so \boxed{\tfrac13}", "0.33"),
        ("(1, 2]", r"$\left( 1, 2 \right]$", "$(1, 2)$"),
        ("x = 3", "$x=3$", "$y = 3$"),
        (r"50\%", "50%", "5"),
        ("#### 1,080", r"\boxed{1080}", r"\boxed{108}"),
        (r"\$18.50", "$18.50", "$18.05"),
        (r"\(\sqrt{2}\)", r"so $\sqrt{2}$", r"$\sqrt{3}$"),
        (r"\[x = 3\]", "$x=3$", "$x=4$"),
    ],
)
def test_latex_references_with_and_without_delimiters(reference: str, right: str, wrong: str):
    assert math_score(right, reference) == 1.0
    assert math_score(wrong, reference) == 0.0


def test_unparseable_reference_scores_zero():
    assert parse_reference("") == ()
    assert math_score("anything", "") == 0.0


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.form}-{'right' if c.right else 'wrong'}")
def test_latex_and_chat_forms(case: Case):
    assert math_score(case.response, case.reference) == float(case.right)


def test_answer_text_follows_the_last_hashes():
    assert answer_text("work... #### 12\n") == "12"
    assert answer_text("#### 1\n#### 2") == "2"
    assert answer_text(r"no marker \boxed{3}") == r"no marker \boxed{3}"


@pytest.mark.parametrize(
    ("text", "value"),
    [("18", 18), ("-3", -3), ("007", 7), ("1,080", 1080), (" 42 ", 42), ("123456789012345", 123456789012345),
     ("1,234,567,890,123", 1234567890123), ("1,08", None), ("1234567890123456", None), ("18.0", None),
     ("18.", None), ("+5", None), ("1 000", None), ("", None), ("x", None)],
)
def test_plain_integer(text: str, value: int | None):
    assert plain_integer(text) == value


@pytest.mark.parametrize(
    ("response", "value"),
    [("#### 1,080", 1080), (r"so the total is \boxed{18} dollars.", 18), (r"\boxed{-1,234}", -1234),
     (r"Final answer: \boxed{18}", None),  # the library's "final answer" patterns come before the box
     (r"$\boxed{18}$", None), (r"\boxed{18} and \boxed{19}", None), (r"\boxed{18} for {x}", None),
     (r"\boxed{18.5}", None), (r"\boxed{{18}}", None), (r"see [1]: \boxed{18}", None), ("The answer is 18.", None)],
)
def test_stated_integer(response: str, value: int | None):
    assert stated_integer(response) == value


def _fast_path_agrees(response: str, reference: str) -> bool:
    decided = quick_verify(response, reference)
    return decided is None or decided == library_verify(response, reference)


def test_fast_path_agrees_with_the_library_on_integer_edge_cases():
    pairs = [("007", "7"), ("-0", "0"), ("1,080", "#### 1080"), ("#### 1080", "1,080"), ("10", "1,0"),
             ("123456789012345", "123456789012344"), ("999,999,999,999,999", "999999999999999"), ("-5", "5"),
             (r"so \boxed{18} dollars.", "18"), (r"\boxed{-1,234}", "-1234"), (r"it is \boxed{18}%", "18"),
             (r"(a) 3 apples (b) \boxed{18}", "18"), (r"\boxed{17} since 17 = 18 - 1", "18")]
    assert all(_fast_path_agrees(r, ref) for r, ref in pairs)
    assert quick_verify("123456789012345", "123456789012344") is False


def test_fast_path_leaves_every_latex_form_to_the_library():
    for case in CASES:
        assert quick_verify(case.response, case.reference) is None, case


def _gsm8k_solutions() -> list[str]:
    rows = []
    for split in ("train", "test"):
        path = GSM8K / f"{split}.jsonl"
        if not path.exists():
            pytest.skip(f"GSM8K not found at {path}")
        with path.open() as f:
            rows += [json.loads(line)["answer"] for line in f if line.strip()]
    return rows


# Every eighth answer in the default suite (the whole set took minutes there); every answer under slow.
@pytest.mark.parametrize("stride", [8, pytest.param(1, marks=pytest.mark.slow)])
def test_fast_path_agrees_with_the_library_on_gsm8k_answers(stride: int):
    solutions = _gsm8k_solutions()
    assert len(solutions) == 7473 + 1319
    solutions = solutions[::stride]
    decided = 0
    for solution in solutions:
        n = int(answer_text(solution).replace(",", ""))
        for response, right in ((solution, True), (f"#### {n:,}", True), (str(n), True), (f"#### {n + 1}", False),
                                (rf"so the total is \boxed{{{n}}}", True), (rf"\boxed{{{n:,}}}", True),
                                (rf"\boxed{{{n - 7}}} in all", False)):
            verdict = quick_verify(response, solution)
            assert verdict is right, (response, solution)
            assert library_verify(response, solution) is right, (response, solution)
            decided += 1
    assert decided == 7 * len(solutions)


def test_math_score_runs_outside_the_main_thread():
    # The library's signal-based time limits would raise here; ours are off (the sandbox has its own).
    scores: list[float] = []
    thread = threading.Thread(target=lambda: scores.append(math_score(r"$\dfrac{1}{2}$", "0.5")))
    thread.start()
    thread.join(timeout=60)
    assert scores == [1.0]


def test_the_library_time_limit_fails_outside_the_main_thread():
    # Why ours are off: with a limit set, the library's signal.alarm refuses to run in a worker thread.
    import math_verify

    errors: list[BaseException] = []

    def parse_with_limit() -> None:
        try:
            math_verify.parse("$1$", parsing_timeout=1)
        except BaseException as exc:  # noqa: BLE001 - recorded and checked below
            errors.append(exc)

    thread = threading.Thread(target=parse_with_limit)
    thread.start()
    thread.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], ValueError) and "thread" in str(errors[0])
