"""Demonstrations of guess-the-number by an imperfect teacher, for a warm start.

The teacher plays the ``guess_number`` environment itself, so its episodes are exactly the ones the
environment gives for a seed::

    guess 1-8:4 higher6 lower5 <eos>
    prompt    | t1 | obs | t2| obs | t3 (wins: the episode ends, 'correct' is never seen)

It bisects: it keeps the range the feedback leaves and guesses its middle. With probability
``mistake_rate`` per turn it errs instead, guessing a number drawn uniformly from ``[1, high]`` other than
the middle, as if it had not read the feedback; the range it keeps stays true to every answer, so it
bisects again after a mistake. Each turn is the guess followed by ``turn_end`` (the rollout's stop
string), as generation writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from m2flow.data.teachers import Demonstration, TeachRequest, register_teacher
from m2flow.envs.text.guess import GuessNumber


@dataclass(frozen=True)
class GuessTeacher:
    """Plays guess-the-number by bisection, guessing at random in a known share of its turns."""

    mistake_rate: float = 0.3
    """Share of turns guessed at random (another number than the bisection's) instead of bisecting."""
    turn_end: str = " "
    """What follows the guess in a turn: the rollout's stop string, as generation ends the turn."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.mistake_rate <= 1.0:
            raise ValueError(f"mistake_rate must be in [0, 1], got {self.mistake_rate}")

    def guess(self, low: int, high: int, top: int, rng: np.random.Generator) -> tuple[int, bool]:
        """(the guess, whether it is a mistake) when the secret lies in ``[low, high]`` of ``[1, top]``."""
        middle = (low + high) // 2
        if top > 1 and float(rng.random()) < self.mistake_rate:
            other = int(rng.integers(1, top))  # uniform over [1, top] without the middle
            return (other if other < middle else other + 1), True
        return middle, False

    def play(self, env: GuessNumber, seed: int, rng: np.random.Generator) -> tuple[Demonstration, list[bool]]:
        """One episode of ``env`` reset with ``seed``, and which of its turns were mistakes."""
        prompt, _ = env.reset(seed=seed)
        low, high = 1, env.high
        turns: list[str] = []
        mistakes: list[bool] = []
        while True:
            guess, mistake = self.guess(low, high, env.high, rng)
            mistakes.append(mistake)
            turns.append(f"{guess}{self.turn_end}")
            observation, _, terminated, truncated, info = env.step(turns[-1])
            if terminated or truncated:
                won = bool(info.get("won", False))
                kind = "bisect" if not any(mistakes) else "mistake"
                return Demonstration(prompt, tuple(turns), kind, won), mistakes
            turns.append(observation)
            if observation == "higher":
                low = max(low, guess + 1)
            elif observation == "lower":
                high = min(high, guess - 1)

    def demonstrations(self, count: int, seed: int = 0, high: int = 100, max_turns: int = 10) -> list[Demonstration]:
        """``count`` episodes of ``GuessNumber(high, max_turns)``, episode k reset with seed ``seed * 1_000_003 + k``."""
        rng = np.random.default_rng(seed)
        env = GuessNumber(high=high, max_turns=max_turns)
        return [self.play(env, seed * 1_000_003 + k, rng)[0] for k in range(count)]


@register_teacher("guess_number")
def _teach(request: TeachRequest) -> list[Demonstration]:
    """The ``guess_number`` teacher: ``GuessTeacher`` with the warm start's ``mistake_rate``, on the
    environment's ``high`` and ``max_turns``, each turn ended by the rollout's stop string."""
    kwargs = {k: request.env_kwargs[k] for k in ("high", "max_turns") if k in request.env_kwargs}
    teacher = GuessTeacher(mistake_rate=request.warm_start.mistake_rate, turn_end=request.turn_end)
    return teacher.demonstrations(request.count, seed=request.seed, **kwargs)
