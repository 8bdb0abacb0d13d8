"""A reward any policy can learn in a few steps: how much of the response is the character '7'; and a
faulty batched reward."""

from m2flow.rewards.registry import batched_reward

TARGET = "7"


def target_fraction(response: str, reference: str) -> float:
    """Fraction of the response's characters equal to ``TARGET`` (0 for an empty response)."""
    del reference  # the reward ignores the task: it only tests that learning happens
    return response.count(TARGET) / len(response) if response else 0.0


@batched_reward
def one_score_short(responses: list[str], references: list[str]) -> list[float]:
    """A faulty batched reward: one score fewer than the responses it was given."""
    del references
    return [0.0] * (len(responses) - 1)
