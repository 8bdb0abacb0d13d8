"""Guess-the-number: find a secret integer in few turns from 'higher' / 'lower' feedback.

``reset(seed)`` picks the secret in ``[1, high]`` from the seed and says ``"guess 1-100:"``. Each turn's
last integer is the guess: the secret wins ``win_reward`` and ends the episode; any other guess costs
``turn_penalty`` and is answered ``"higher"`` or ``"lower"``; a turn without an integer costs the same
and is answered ``"a number?"``. After ``max_turns`` turns the episode is truncated. The return of an
episode is therefore ``win_reward - turn_penalty * wrong turns`` when it is won: fewer turns, more return.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from m2flow.envs.text.base import register_text_env

_INT = re.compile(r"-?\d+")


@register_text_env("guess_number")
class GuessNumber:
    """Binary search with words: the optimal policy wins in ceil(log2(high + 1)) turns."""

    def __init__(self, high: int = 100, max_turns: int = 10, win_reward: float = 1.0, turn_penalty: float = 0.05) -> None:
        if high < 1:
            raise ValueError(f"high must be >= 1, got {high}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.high, self.max_turns = high, max_turns
        self.win_reward, self.turn_penalty = win_reward, turn_penalty
        self.secret: int | None = None
        self.turns = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.secret = int(np.random.default_rng(seed).integers(1, self.high + 1))
        self.turns = 0
        return f"guess 1-{self.high}:", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.secret is None:
            raise RuntimeError("step before reset")
        self.turns += 1
        found = _INT.findall(action)
        truncated = self.turns >= self.max_turns
        info: dict[str, Any] = {"turns": self.turns}
        if not found:
            return "a number?", -self.turn_penalty, False, truncated, {**info, "valid": False}
        guess = int(found[-1])
        info.update(valid=True, guess=guess)
        if guess == self.secret:
            return "correct", self.win_reward, True, False, {**info, "won": True}
        return ("higher" if guess < self.secret else "lower"), -self.turn_penalty, False, truncated, {**info, "won": False}
