"""User-style reward functions for the registry tests, loaded by ``module:function`` path."""

from __future__ import annotations

from m2flow.rewards.registry import batched_reward


def length_reward(response: str, reference: str) -> float:
    """A user reward for the registry tests: 1 per character, capped at 10."""
    return float(min(len(response), 10))


@batched_reward
def batched_length_reward(responses: list[str], references: list[str]) -> list[float]:
    return [float(len(r)) for r in responses]


def string_reward(response: str, reference: str) -> str:
    return "1.0"


def nan_reward(response: str, reference: str) -> float:
    return float("nan")


def short_batch_reward(responses: list[str], references: list[str]) -> list[float]:
    return [1.0] * (len(responses) - 1)


NOT_CALLABLE = 3
