"""The calculator task's demonstrations: the teacher's share of errors, and pairs that train model turns only."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from m2flow.data.calculator_demos import CALCULATOR_ALPHABET, CalculatorTeacher, sft_pairs
from m2flow.envs.text.calculator import draw_problem
from m2flow.rewards.tools.calls import format_call, format_result, parse_call


def test_the_teacher_errs_in_the_configured_shares():
    demos = CalculatorTeacher(skip_rate=0.2, copy_error_rate=0.1).demonstrations(4000, seed=1)
    kinds = Counter(d.kind for d in demos)
    assert kinds["skip"] / 4000 == pytest.approx(0.2, abs=0.025)
    assert kinds["copy_error"] / 4000 == pytest.approx(0.1, abs=0.02)
    assert all(d.correct == (d.kind == "tool") for d in demos)


def test_each_kind_of_demonstration_is_what_it_claims():
    for d in CalculatorTeacher(skip_rate=0.3, copy_error_rate=0.3).demonstrations(300, seed=2):
        a, b = (int(x) for x in d.prompt.removesuffix("=").split("*"))
        final = int(d.turns[-1])
        if d.kind == "skip":
            assert len(d.turns) == 1 and final != a * b and len(str(final)) == len(str(a * b))
        else:
            call = parse_call(d.turns[0])
            assert (call.status, call.name, call.argument) == ("call", "calculator", f"{a}*{b}")
            assert d.turns[1] == format_result(str(a * b)) and (final == a * b) == (d.kind == "tool")
        assert set("".join((d.prompt, *d.turns))) <= set(CALCULATOR_ALPHABET)


def test_demonstrations_use_the_environments_problems_and_the_seed():
    teacher = CalculatorTeacher()
    demos = teacher.demonstrations(5, seed=3, split="test")
    assert [d.prompt for d in demos] == [f"{a}*{b}=" for a, b in (draw_problem(3 * 1_000_003 + k, split="test")
                                                                   for k in range(5))]
    assert demos == teacher.demonstrations(5, seed=3, split="test")


def test_sft_pairs_target_model_turns_and_never_an_observation():
    demos = CalculatorTeacher(skip_rate=0.5, copy_error_rate=0.0).demonstrations(20, seed=4)
    pairs = sft_pairs(demos)
    assert len(pairs) == sum(1 if d.kind == "skip" else 2 for d in demos)
    for context, target in pairs:
        assert "<result>" not in target and (target.startswith("<tool>") or target.isdigit())
    d = next(d for d in demos if d.kind == "tool")
    assert (d.prompt, d.turns[0]) in pairs and (d.prompt + d.turns[0] + d.turns[1], d.turns[2]) in pairs


def test_rates_are_checked():
    with pytest.raises(ValueError, match="sum <= 1"):
        CalculatorTeacher(skip_rate=0.7, copy_error_rate=0.5)
    assert CalculatorTeacher(skip_rate=0.0, copy_error_rate=0.0).demonstrate(123, 456, np.random.default_rng(0)).turns == (
        format_call("calculator", "123*456"), format_result("56088"), "56088")
