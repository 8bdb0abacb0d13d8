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


def flaky_reward(response: str, reference: str) -> float:
    """1.0, except: "slow" never answers, "bad" raises, "nan" returns NaN, "inf" an infinity, "die" kills its process."""
    import math
    import os
    import time

    if response == "slow":
        time.sleep(60)
    if response == "bad":
        raise ValueError("bad response")
    if response == "die":
        os._exit(3)
    return {"nan": math.nan, "inf": math.inf}.get(response, 1.0)


@batched_reward
def sleeping_batch_reward(responses: list[str], references: list[str]) -> list[float]:
    """Never answers in time."""
    import time

    time.sleep(60)
    return [1.0] * len(responses)


def raising_reward(response: str, reference: str) -> float:
    """Always raises: a reward with a bug."""
    raise KeyError("no such field")


def pid_reward(response: str, reference: str) -> float:
    """The id of the process the check ran in: tells a sandboxed check from one run in process."""
    import os

    return float(os.getpid())
