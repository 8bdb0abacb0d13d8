"""Reward functions by name or ``module:function`` path, with their outputs checked.

A reward function is either per-sample, ``fn(response, reference) -> float``, or batched,
``fn(responses, references) -> Sequence[float]`` (mark it with ``@batched_reward`` or register it
with ``batched=True``). ``load_reward_fn`` turns either into a ``RewardFunction`` that always takes
and returns batches and raises a ``RewardFunctionError`` naming the function when it cannot be
imported or returns something that is not one finite float per sample.

Built-ins: ``math`` (answer verification with math-verify under a time limit), ``format`` (the
response states a final answer explicitly) and ``exact_answer`` (the whole response is the
reference, as for the arithmetic task).
"""

from __future__ import annotations

import importlib
import math
import numbers
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from m2flow.algorithms.registry import Registry
from m2flow.config.errors import InputError
from m2flow.rewards.sandbox import VerifyStats, score_batch


class RewardFunctionError(Exception):
    """A reward function could not be loaded or returned something unusable."""


class RewardLoadError(RewardFunctionError, ImportError):
    """The ``module:function`` path does not import or does not name a callable."""


class RewardOutputError(RewardFunctionError, InputError, TypeError):
    """The function returned the wrong type, the wrong length, or a non-finite number (a bug in the
    configured ``reward.fn``: the CLI reports it as one ``error:`` line)."""


@dataclass(frozen=True)
class RewardEntry:
    """A registered reward: the function and how it is called."""

    fn: Callable[..., Any]
    batched: bool = False
    # Batched only: the function returns (scores, VerifyStats) instead of scores.
    returns_stats: bool = False


REWARD_FNS: Registry[RewardEntry] = Registry("reward function")


def register_reward(
    name: str, *, batched: bool = False, returns_stats: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a reward function under ``name`` (duplicate names raise)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        REWARD_FNS.add(name, RewardEntry(fn, batched=batched, returns_stats=returns_stats))
        return fn

    return decorate


def batched_reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``module:function`` reward as batched: called once with the lists of a whole batch."""
    fn.m2flow_batched = True  # type: ignore[attr-defined]
    return fn


class RewardFunction:
    """A loaded reward: ``fn(responses, references) -> list[float]``, outputs validated."""

    def __init__(self, name: str, entry: RewardEntry) -> None:
        self.name = name
        self.entry = entry
        self.stats = VerifyStats()  # accumulated over calls; see pop_stats

    def __call__(self, responses: Sequence[str], references: Sequence[str]) -> list[float]:
        """Scores (B,) for B responses and their B references."""
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} references")
        start = time.perf_counter()
        if self.entry.batched:
            out = self.entry.fn(list(responses), list(references))
            if self.entry.returns_stats:
                out, stats = out
                self.stats += stats
                self.stats.total -= len(responses)  # counted below for every kind of function
            scores = self._check_batch(out, len(responses))
        else:
            pairs = enumerate(zip(responses, references))
            scores = [self._check_one(self.entry.fn(r, ref), i) for i, (r, ref) in pairs]
        self.stats.total += len(responses)
        self.stats.seconds += time.perf_counter() - start
        return scores

    def pop_stats(self) -> VerifyStats:
        """The stats accumulated since the last call to ``pop_stats``, resetting them."""
        stats, self.stats = self.stats, VerifyStats()
        return stats

    def _check_one(self, value: Any, index: int) -> float:
        if isinstance(value, numbers.Real):
            score = float(value)
            if math.isfinite(score):
                return score
            raise RewardOutputError(f"reward.fn: reward function {self.name!r} returned {score} for sample {index}")
        hint = " (use .item() for a one-element tensor)" if hasattr(value, "item") else ""
        raise RewardOutputError(
            f"reward.fn: reward function {self.name!r} returned {type(value).__name__} {_short(value)} for sample "
            f"{index}; expected a float{hint}"
        )

    def _check_batch(self, out: Any, expected: int) -> list[float]:
        if hasattr(out, "tolist") and not isinstance(out, (str, bytes)):
            out = out.tolist()  # numpy arrays and tensors
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
            raise RewardOutputError(
                f"reward.fn: batched reward function {self.name!r} returned {type(out).__name__} {_short(out)}; "
                f"expected a sequence of {expected} floats"
            )
        if len(out) != expected:
            raise RewardOutputError(
                f"reward.fn: batched reward function {self.name!r} returned {len(out)} scores for {expected} samples"
            )
        return [self._check_one(value, i) for i, value in enumerate(out)]

    def __repr__(self) -> str:
        return f"RewardFunction({self.name!r}, batched={self.entry.batched})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _import_path(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RewardLoadError(f"reward path {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure gets the same clear message
        raise RewardLoadError(f"cannot import module {module_name!r} for reward {spec!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardLoadError(f"module {module_name!r} has no attribute {attr!r} (reward {spec!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardLoadError(f"reward {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def load_reward_fn(spec: str | Callable[..., Any], *, batched: bool | None = None) -> RewardFunction:
    """A reward by registered name ("math"), by path ("pkg.mod:fn") or a callable, ready for batches.

    ``batched`` overrides how a path or callable is called; by default it is per-sample unless
    the function was marked with ``@batched_reward``.
    """
    if callable(spec):
        fn, name = spec, getattr(spec, "__qualname__", repr(spec))
    elif isinstance(spec, str) and ":" in spec:
        fn, name = _import_path(spec), spec
    elif isinstance(spec, str):
        entry = REWARD_FNS.get(spec)
        if batched is not None and batched != entry.batched:
            raise ValueError(f"reward {spec!r} is registered with batched={entry.batched}")
        return RewardFunction(spec, entry)
    else:
        raise TypeError(f"reward spec must be a name, a 'module:function' path or a callable, got {spec!r}")
    is_batched = bool(getattr(fn, "m2flow_batched", False)) if batched is None else batched
    return RewardFunction(name, RewardEntry(fn, batched=is_batched))


@register_reward("math", batched=True, returns_stats=True)
def math_reward(responses: list[str], references: list[str]) -> tuple[list[float], VerifyStats]:
    """1.0 when the final answer equals the reference (math-verify: values, LaTeX, sets, intervals), else 0.0."""
    return score_batch(responses, references)


# An explicitly stated final answer: a non-empty \boxed{}/\fbox{}, a "#### N" line, "the answer is N"
# or "answer: N". Each part scans a run of spaces at most once, so the (untrusted) response costs
# time linear in its length.
_STATED_ANSWER = re.compile(
    r"\\(?:boxed|fbox)\s*\{\s*[^\s}]|####[ \t]*\S|\banswer\s*(?:is|:|=)[ \t:]*[^\s.]", re.IGNORECASE
)


@register_reward("format")
def format_reward(response: str, reference: str) -> float:
    """1.0 when the response states its final answer explicitly (\\boxed, ####, "the answer is")."""
    del reference  # the format does not depend on the answer
    return 1.0 if _STATED_ANSWER.search(response) else 0.0


@register_reward("exact_answer")
def exact_answer_reward(response: str, reference: str) -> float:
    """1.0 when the whole response, stripped of surrounding whitespace, is the reference, else 0.0.

    Nothing is extracted or normalised: for tasks whose answer is the entire response (arithmetic,
    '07+15=' -> '22'), so a right answer followed by anything but the end of sequence earns nothing.
    """
    return 1.0 if response.strip() == reference.strip() else 0.0
