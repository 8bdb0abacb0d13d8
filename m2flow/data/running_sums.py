"""Running sums: a synthetic task with a variable number of reasoning steps and a long tail of lengths.

The prompt is a list of k digits written at a fixed width (``max_steps``, the rest filled with '.'),
then '='; the answer is the k running sums mod 10, one digit per step: "314" + "." * 21 + "=" -> "348".
Output digit i is the previous output plus input digit i, so a left-to-right model does one step per
token, always with the same two operands at fixed distances (hence the fixed width). k is drawn with
P(k) proportional to k ** -length_tail, so most prompts take a few steps and a few take up to
``max_steps``: with the defaults (1..24, tail 1) a batch of 32 prompts spreads its answers from 2 to
about 25 tokens (end of sequence included), the long-tail workload partial rollouts are for.

Each problem belongs to the train or held-out split by a fixed hash of its text, as in
``m2flow.data.arithmetic``. Problems are drawn with replacement: a short k has only 10 ** k problems,
too few to fill a split of distinct ones without bending the length distribution. The imperfect
teacher (``demonstrations``) slips in a share of its answers: it skips every digit that would take the
running sum past 9, keeping the sum it had, the analogue of a forgotten carry.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

RUNNING_SUMS_ALPHABET = "0123456789.="
"""Every character a prompt or answer of this task can contain."""

FILLER = "."
Split = Literal["train", "test"]
_HASH_BUCKETS = 10_000
_TRIES_PER_PROBLEM = 1_000  # rejection draws allowed per problem before a split counts as (nearly) empty


@dataclass(frozen=True)
class RunningSumsTask:
    """Prompts of 1..`max_steps` digits at a fixed width; the answer is their running sums mod 10."""

    alphabet: ClassVar[str] = RUNNING_SUMS_ALPHABET
    max_steps: int = 24
    """Most digits in a prompt (the prompt's fixed width); answers are 1..max_steps digits long."""
    length_tail: float = 1.0
    """P(k digits) is proportional to k ** -length_tail: 0 draws k uniformly, larger makes long ones rarer."""
    heldout_fraction: float = 0.1
    """Share of all problems that belongs to the held-out ('test') split."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.length_tail >= 0.0:
            raise ValueError(f"length_tail must be >= 0, got {self.length_tail}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")

    def step_probabilities(self) -> np.ndarray:
        """P(k) for k = 1 .. max_steps, shape (max_steps,)."""
        w = np.arange(1, self.max_steps + 1, dtype=float) ** -self.length_tail
        return w / w.sum()

    def prompt(self, digits: Sequence[int]) -> str:
        """The prompt text: the digits, filler up to the fixed width, '='."""
        if not 1 <= len(digits) <= self.max_steps:
            raise ValueError(f"a prompt has 1..{self.max_steps} digits, got {len(digits)}")
        return "".join(map(str, digits)) + FILLER * (self.max_steps - len(digits)) + "="

    @staticmethod
    def parse(prompt: str) -> list[int]:
        """The digits of a prompt text."""
        body = prompt.strip().removesuffix("=").rstrip(FILLER)
        if not body.isdigit():
            raise ValueError(f"not a running-sums prompt: {prompt!r}")
        return [int(c) for c in body]

    @staticmethod
    def solve(digits: Sequence[int]) -> str:
        """The k running sums mod 10, e.g. [3, 1, 4] -> '348'."""
        out, total = [], 0
        for d in digits:
            total = (total + d) % 10
            out.append(str(total))
        return "".join(out)

    @staticmethod
    def slip(digits: Sequence[int]) -> str:
        """The teacher's slip: a digit that would take the sum past 9 is skipped, e.g. [3, 8, 4] -> '337'."""
        out, total = [], 0
        for d in digits:
            if total + d < 10:
                total += d
            out.append(str(total))
        return "".join(out)

    def split_of(self, digits: Sequence[int]) -> Split:
        """Which split a problem belongs to, fixed by a hash of its prompt text."""
        bucket = zlib.crc32(self.prompt(digits).encode()) % _HASH_BUCKETS
        return "test" if bucket < self.heldout_fraction * _HASH_BUCKETS else "train"

    def sample(self, split: Split, count: int, seed: int = 0) -> list[dict[str, str]]:
        """`count` problems of one split as `{"prompt", "answer"}` dicts, drawn with replacement with `seed`:
        k from `step_probabilities`, then each digit uniformly, redrawn until the problem is in `split`."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = np.random.default_rng(seed)
        probs, out, tries = self.step_probabilities(), [], 0
        while len(out) < count:
            tries += 1
            if tries > _TRIES_PER_PROBLEM * count:
                raise ValueError(f"the {split} split of max_steps {self.max_steps} holds too few problems to draw "
                                 f"{count} from")
            k = 1 + int(rng.choice(self.max_steps, p=probs))
            digits = [int(d) for d in rng.integers(0, 10, size=k)]
            if self.split_of(digits) == split:
                out.append({"prompt": self.prompt(digits), "answer": self.solve(digits)})
        return out

    def demonstrations(self, problems: Sequence[dict[str, str]], slip_rate: float, seed: int = 0) -> list[dict[str, str]]:
        """Worked answers of an imperfect teacher: each problem gets the `slip` answer with probability `slip_rate`."""
        if not 0.0 <= slip_rate <= 1.0:
            raise ValueError(f"slip_rate must be in [0, 1], got {slip_rate}")
        rng = np.random.default_rng(seed)
        return [{"prompt": p["prompt"], "answer": self.slip(self.parse(p["prompt"])) if r < slip_rate else p["answer"]}
                for p, r in zip(problems, rng.random(len(problems)))]

    def teacher_demonstrations(self, count: int, slip_rate: float, seed: int = 0) -> list[dict[str, str]]:
        """`count` training problems answered by the imperfect teacher."""
        return self.demonstrations(self.sample("train", count, seed=seed), slip_rate, seed=seed)
