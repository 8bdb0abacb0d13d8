"""Demonstrations of the calculator task's tool-call format, by an imperfect teacher, for a warm start.

A correct demonstration is two model turns around one tool call::

    123*456=<tool>calculator: 123*456</tool><result>56088</result>56088<eos>
    prompt | model turn 1 (the call)        | observation          | model turn 2 (answer)

``CalculatorTeacher`` errs as a hurried person would: with probability ``skip_rate`` it skips the tool
and writes a guess (the product with one digit changed), and with probability ``copy_error_rate`` it
makes the call but copies the result wrong (two neighbouring digits swapped, or one changed when they
are equal). ``sft_pairs`` cuts each demonstration into (context, model turn) pairs, so a supervised loss
on the targets alone trains the model's tokens and never the observation's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from m2flow.data.teachers import Demonstration, TeachRequest, register_teacher
from m2flow.envs.text.calculator import Split, draw_problem, problem_text
from m2flow.rewards.tools.calls import CALL_CLOSE, format_call, format_result

CALCULATOR_ALPHABET = sorted(set("0123456789*+-=/%() :_<>abcdefghijklmnopqrstuvwxyz"))
"""Characters of the task, the tool-call tags and error observations' common words (a char tokenizer's vocabulary)."""


def _perturb(value: int, rng: np.random.Generator) -> int:
    """The value with one digit changed (never the leading digit to 0)."""
    digits = list(str(value))
    pos = int(rng.integers(len(digits)))
    choices = [d for d in "0123456789" if d != digits[pos] and not (pos == 0 and d == "0")]
    digits[pos] = choices[int(rng.integers(len(choices)))]
    return int("".join(digits))


def _miscopy(value: int, rng: np.random.Generator) -> int:
    """The value with two neighbouring digits swapped, or one digit changed when they are equal."""
    digits = list(str(value))
    if len(digits) > 1:
        pos = int(rng.integers(len(digits) - 1))
        if digits[pos] != digits[pos + 1] and not (pos == 0 and digits[1] == "0"):
            digits[pos], digits[pos + 1] = digits[pos + 1], digits[pos]
            return int("".join(digits))
    return _perturb(value, rng)


@dataclass(frozen=True)
class CalculatorTeacher:
    """Writes calculator-task demonstrations, wrong in a known share of them."""

    skip_rate: float = 0.2
    """Share of demonstrations that skip the tool and guess (a wrong answer)."""
    copy_error_rate: float = 0.1
    """Share that call the tool but copy its result wrong."""
    digits: int = 3

    def __post_init__(self) -> None:
        if not (0 <= self.skip_rate and 0 <= self.copy_error_rate and self.skip_rate + self.copy_error_rate <= 1):
            raise ValueError(f"skip_rate and copy_error_rate must be >= 0 with a sum <= 1, got "
                             f"{self.skip_rate} and {self.copy_error_rate}")

    def demonstrate(self, a: int, b: int, rng: np.random.Generator) -> Demonstration:
        """One demonstration of a * b."""
        product, r = a * b, float(rng.random())
        if r < self.skip_rate:
            return Demonstration(problem_text(a, b), (str(_perturb(product, rng)),), "skip", False)
        call = format_call("calculator", f"{a}*{b}")
        observation = format_result(str(product))
        if r < self.skip_rate + self.copy_error_rate:
            return Demonstration(problem_text(a, b), (call, observation, str(_miscopy(product, rng))), "copy_error",
                                 False)
        return Demonstration(problem_text(a, b), (call, observation, str(product)), "tool", True)

    def demonstrations(self, count: int, seed: int = 0, split: Split = "train") -> list[Demonstration]:
        """``count`` demonstrations of problems of ``split``, the problem of episode k drawn as the
        environment draws it for seed ``seed * 1_000_003 + k``."""
        rng = np.random.default_rng(seed)
        out = []
        for k in range(count):
            a, b = draw_problem(seed * 1_000_003 + k, self.digits, split)
            out.append(self.demonstrate(a, b, rng))
        return out


def sft_pairs(demos: Sequence[Demonstration]) -> list[tuple[str, str]]:
    """(context, model turn) pairs: one per model turn, the context everything before it. A turn that
    calls a tool ends at the call's closing tag, as generation stops there."""
    pairs = []
    for d in demos:
        context = d.prompt
        for k, text in enumerate(d.turns):
            if k % 2 == 0:
                if CALL_CLOSE in text and not text.endswith(CALL_CLOSE):
                    raise ValueError(f"a calling turn must end at its call: {text!r}")
                pairs.append((context, text))
            context += text
    return pairs


@register_teacher("calculator")
def _teach(request: TeachRequest) -> list[Demonstration]:
    """The ``calculator`` teacher: ``CalculatorTeacher`` with the warm start's ``skip_rate``,
    ``copy_error_rate`` and ``digits``."""
    ws = request.warm_start
    teacher = CalculatorTeacher(skip_rate=ws.skip_rate, copy_error_rate=ws.copy_error_rate, digits=ws.digits)
    return teacher.demonstrations(request.count, seed=request.seed)
