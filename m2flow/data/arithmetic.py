"""A synthetic arithmetic task ("12+7=" -> "19") for offline demos and tests.

Each problem belongs to the train or held-out split by a fixed hash of its text, so the two splits
never share a problem, whatever the seed or the number of samples drawn.

Answers may be written least significant digit first (``reverse_answer``: "12+9=" -> "12"), the
order in which a left-to-right model can compute each digit from the operands and the carry it has
just produced. ``ArithmeticTask.demonstrations`` plays an imperfect teacher: in a share of the
problems it forgets every carry and borrow (``slip``), the classic schoolroom error.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

ARITHMETIC_ALPHABET = "0123456789+-*= "
"""Every character a prompt or answer of this task can contain."""

Split = Literal["train", "test"]
_OPERATORS = ("+", "-", "*")
_HASH_BUCKETS = 10_000
_ENUMERATE_LIMIT = 200_000  # below this many problems, enumerate instead of rejection sampling


@dataclass(frozen=True)
class ArithmeticTask:
    """Problems `a<op>b=` with operands of up to `digits` digits; the answer is the exact result."""

    alphabet: ClassVar[str] = ARITHMETIC_ALPHABET
    digits: int = 2
    """Largest number of digits of each operand (operands are 0 .. 10**digits - 1)."""
    operators: tuple[str, ...] = ("+", "-")
    """Operators to draw from; any of '+', '-', '*'."""
    heldout_fraction: float = 0.1
    """Share of all problems that belongs to the held-out ('test') split."""
    allow_negative: bool = False
    """If False, subtraction puts the larger operand first so results are never negative."""
    reverse_answer: bool = False
    """Write answers least significant digit first ('12+9=' -> '12'); a minus sign stays in front."""
    pad_operands: bool = False
    """Write every operand with `digits` digits ('07+12='), so each digit sits at a fixed position."""

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"digits must be >= 1, got {self.digits}")
        if not self.operators:
            raise ValueError("operators must not be empty")
        bad = [op for op in self.operators if op not in _OPERATORS]
        if bad:
            raise ValueError(f"unknown operator(s) {bad}; valid: {list(_OPERATORS)}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")

    @staticmethod
    def prompt(a: int, op: str, b: int, width: int = 0) -> str:
        """The prompt text, e.g. '12+7=' (or '12+07=' with `width` 2)."""
        return f"{a:0{width}d}{op}{b:0{width}d}=" if width else f"{a}{op}{b}="

    def text(self, a: int, op: str, b: int) -> str:
        """The prompt text of a problem as this task writes it."""
        return self.prompt(a, op, b, self.digits if self.pad_operands else 0)

    @staticmethod
    def solve(a: int, op: str, b: int) -> str:
        """The answer text, e.g. '19'."""
        if op == "+":
            return str(a + b)
        if op == "-":
            return str(a - b)
        return str(a * b)

    @staticmethod
    def slip(a: int, op: str, b: int) -> str:
        """The answer with every carry (+) or borrow (-) forgotten, e.g. '18+5=' -> '13', '52-17=' -> '45'."""
        if op not in ("+", "-"):
            raise ValueError(f"slip is defined for '+' and '-', not {op!r}")
        if op == "-" and a < b:
            return "-" + ArithmeticTask.slip(b, op, a)
        value, place = 0, 1
        while a or b:
            da, db = a % 10, b % 10
            value += ((da + db) % 10 if op == "+" else (da - db) % 10) * place
            a, b, place = a // 10, b // 10, place * 10
        return str(value)

    @staticmethod
    def parse(prompt: str) -> tuple[int, str, int]:
        """(a, op, b) of a prompt text such as '12+7='."""
        body = prompt.strip().removesuffix("=")
        for i, ch in enumerate(body):
            if ch in _OPERATORS and i > 0:
                return int(body[:i]), ch, int(body[i + 1 :])
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")

    def write(self, value: str) -> str:
        """An answer value ('-12') in this task's digit order ('-21' when `reverse_answer`)."""
        if not self.reverse_answer:
            return value
        sign, digits = ("-", value[1:]) if value.startswith("-") else ("", value)
        return sign + digits[::-1]

    def answer(self, a: int, op: str, b: int) -> str:
        """The answer text in this task's digit order."""
        return self.write(self.solve(a, op, b))

    def demonstrations(self, problems: Sequence[dict[str, str]], slip_rate: float, seed: int = 0) -> list[dict[str, str]]:
        """Worked answers of an imperfect teacher: each problem gets the `slip` answer with probability `slip_rate`.

        The draw is per demonstration, not per problem, so a problem shown twice may get both answers.
        """
        if not 0.0 <= slip_rate <= 1.0:
            raise ValueError(f"slip_rate must be in [0, 1], got {slip_rate}")
        rng = np.random.default_rng(seed)
        out = []
        for p, r in zip(problems, rng.random(len(problems))):
            answer = p["answer"]
            if r < slip_rate:
                answer = self.write(self.slip(*self.parse(p["prompt"])))
            out.append({"prompt": p["prompt"], "answer": answer})
        return out

    def teacher_demonstrations(self, count: int, slip_rate: float, seed: int = 0) -> list[dict[str, str]]:
        """`count` training problems drawn with replacement, answered by the imperfect teacher."""
        return self.demonstrations(self.sample("train", count, seed=seed, unique=False), slip_rate, seed=seed)

    def split_of(self, a: int, op: str, b: int) -> Split:
        """Which split a problem belongs to, fixed by a hash of its prompt text."""
        bucket = zlib.crc32(self.prompt(a, op, b).encode()) % _HASH_BUCKETS
        return "test" if bucket < self.heldout_fraction * _HASH_BUCKETS else "train"

    def _canonical(self, a: int, op: str, b: int) -> tuple[int, str, int]:
        if op == "-" and not self.allow_negative and a < b:
            return b, op, a
        return a, op, b

    def _all_problems(self) -> Iterator[tuple[int, str, int]]:
        top = 10**self.digits
        for op in self.operators:
            for a in range(top):
                for b in range(top):
                    if (a, op, b) == self._canonical(a, op, b):
                        yield a, op, b

    @property
    def space_size(self) -> int:
        """Upper bound on the number of distinct problems (before the split)."""
        return (10**self.digits) ** 2 * len(self.operators)

    def sample(self, split: Split, count: int, seed: int = 0, unique: bool = True) -> list[dict[str, str]]:
        """`count` problems of one split as `{"prompt", "answer"}` dicts, drawn with `seed`.

        With `unique=True` no problem repeats; asking for more than the split holds is an error.
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = np.random.default_rng(seed)
        if self.space_size <= _ENUMERATE_LIMIT:
            pool = [p for p in self._all_problems() if self.split_of(*p) == split]
            if unique and count > len(pool):
                raise ValueError(f"the {split} split has only {len(pool)} distinct problems, asked for {count}")
            picks = rng.choice(len(pool), size=count, replace=not unique)
            chosen = [pool[int(i)] for i in picks]
        else:
            chosen, seen = [], set()
            top = 10**self.digits
            while len(chosen) < count:
                a, b = (int(x) for x in rng.integers(0, top, size=2))
                op = self.operators[int(rng.integers(len(self.operators)))]
                problem = self._canonical(a, op, b)
                if self.split_of(*problem) != split or (unique and problem in seen):
                    continue
                seen.add(problem)
                chosen.append(problem)
        return [{"prompt": self.text(*p), "answer": self.answer(*p)} for p in chosen]
