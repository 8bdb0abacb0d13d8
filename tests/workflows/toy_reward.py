"""A reward any policy can learn in a few steps: how much of the response is the character '7'."""

TARGET = "7"


def target_fraction(response: str, reference: str) -> float:
    """Fraction of the response's characters equal to ``TARGET`` (0 for an empty response)."""
    del reference  # the reward ignores the task: it only tests that learning happens
    return response.count(TARGET) / len(response) if response else 0.0

