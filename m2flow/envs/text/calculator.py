"""The calculator task: products the model cannot work out in its head (3 digits x 3 digits by default).

``reset(seed)`` draws a problem and shows it as ``"123*456="``; a turn without a tool call is the
answer, rewarded 1.0 when it is exactly the product (an integer, whitespace around it allowed), else
0.0, and the episode ends. With ``tools=True`` (the registered ``calculator`` env) the model may call
``<tool>calculator: 123*456</tool>`` first and read ``<result>56088</result>``.

Held-out problems are disjoint from training ones: every problem belongs to the ``train`` or ``test``
split by a fixed hash of its text, and ``reset`` draws from the seed until it lands in the env's split,
so no seed of one split ever shows a problem of the other.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from m2flow.envs.text.base import register_text_env
from m2flow.envs.text.tool_env import ToolEnv
from m2flow.rewards.tools.latency import parse_latency
from m2flow.rewards.tools.registry import ToolBox

Split = Literal["train", "test"]
_ANSWER = re.compile(r"\s*(-?\d+)\s*")
_BUCKETS = 10_000


def problem_text(a: int, b: int) -> str:
    """The observation of a problem, e.g. '123*456='."""
    return f"{a}*{b}="


def split_of(a: int, b: int, heldout_fraction: float = 0.1) -> Split:
    """The split a problem belongs to, fixed by a hash of its text."""
    return "test" if zlib.crc32(problem_text(a, b).encode()) % _BUCKETS < heldout_fraction * _BUCKETS else "train"


def draw_problem(seed: int, digits: int = 3, split: Split = "train", heldout_fraction: float = 0.1) -> tuple[int, int]:
    """The (a, b) of a seed: operands of exactly ``digits`` digits, drawn until the problem is in ``split``."""
    rng = np.random.default_rng(seed)
    low, high = 10 ** (digits - 1), 10**digits
    while True:
        a, b = (int(x) for x in rng.integers(low, high, size=2))
        if split_of(a, b, heldout_fraction) == split:
            return a, b


class CalculatorTask:
    """One product per episode; the first turn without a tool call is the answer."""

    def __init__(self, digits: int = 3, split: Split = "train", heldout_fraction: float = 0.1) -> None:
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.digits, self.split, self.heldout_fraction = digits, split, heldout_fraction
        self.problem: tuple[int, int] | None = None

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else seed
        self.problem = draw_problem(seed, self.digits, self.split, self.heldout_fraction)
        a, b = self.problem
        return problem_text(a, b), {"answer": str(a * b)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.problem is None:
            raise RuntimeError("step before reset")
        a, b = self.problem
        match = _ANSWER.fullmatch(action)
        correct = match is not None and int(match.group(1)) == a * b
        return "", 1.0 if correct else 0.0, True, False, {"answer": str(a * b), "correct": correct}


@register_text_env("calculator")
def calculator_env(digits: int = 3, split: Split = "train", heldout_fraction: float = 0.1, tools: bool = True,
                   tool_timeout_s: float = 5.0, max_calls: int | None = 4,
                   tool_latency_s: Sequence[float] | Mapping[str, Any] | None = None) -> CalculatorTask | ToolEnv:
    """The calculator task, with the ``calculator`` tool unless ``tools`` is False; ``tool_latency_s``
    ``[low, high]``: each call waits a time drawn uniformly from it (seconds, seeded by the episode); or a
    distribution, e.g. ``{dist: lognormal, median_s: 0.02, sigma: 1.5, max_s: 0.5}`` (``tools/latency.py``)."""
    task = CalculatorTask(digits, split, heldout_fraction)
    if not tools:
        return task
    try:
        latency = parse_latency(tool_latency_s)
    except ValueError as e:
        raise ValueError(f"tool_latency_s: {e}") from None
    box = ToolBox.from_names(["calculator"], timeout_s=tool_timeout_s, latency_s=latency)
    return ToolEnv(task, box, max_calls=max_calls)
