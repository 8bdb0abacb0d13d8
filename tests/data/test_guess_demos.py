"""The guessing teacher bisects, errs at its stated rate, and its episodes are the environment's own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from m2flow.data.guess_demos import GuessTeacher
from m2flow.envs.text.guess import GuessNumber


def _guesses(turns: tuple[str, ...]) -> list[int]:
    return [int(t) for t in turns[::2]]


@pytest.mark.parametrize("rate", [0.2, 0.4])
def test_the_teacher_guesses_at_random_in_the_stated_share_of_its_turns(rate):
    teacher, env, rng = GuessTeacher(mistake_rate=rate), GuessNumber(high=8, max_turns=4), np.random.default_rng(1)
    flags = [m for k in range(3000) for m in teacher.play(env, k, rng)[1]]
    assert len(flags) > 6000
    assert abs(sum(flags) / len(flags) - rate) < 0.02


def test_a_mistake_is_never_the_bisection_guess_and_stays_in_range():
    teacher, rng = GuessTeacher(mistake_rate=1.0), np.random.default_rng(0)
    seen = set()
    for _ in range(2000):
        guess, mistake = teacher.guess(3, 6, 8, rng)
        assert mistake and guess != 4 and 1 <= guess <= 8
        seen.add(guess)
    assert seen == {1, 2, 3, 5, 6, 7, 8}  # uniform over every other number


def test_without_mistakes_the_teacher_bisects_and_always_wins_in_log_turns():
    for high in (8, 20, 100):
        demos = GuessTeacher(mistake_rate=0.0).demonstrations(200, seed=3, high=high, max_turns=10)
        assert all(d.correct and d.kind == "bisect" for d in demos)
        assert max(len(_guesses(d.turns)) for d in demos) == math.ceil(math.log2(high + 1))


def test_an_imperfect_teacher_loses_some_episodes_and_takes_more_turns():
    clean = GuessTeacher(mistake_rate=0.0).demonstrations(2000, seed=0, high=8, max_turns=4)
    erring = GuessTeacher(mistake_rate=0.4).demonstrations(2000, seed=0, high=8, max_turns=4)
    wins = sum(d.correct for d in erring) / len(erring)
    assert 0.6 < wins < 0.85
    assert sum(len(d.turns) for d in erring) > sum(len(d.turns) for d in clean)


def test_demonstrations_replay_exactly_in_the_environment():
    # The feedback in each demonstration is what the environment answers; the last turn ends the episode.
    teacher = GuessTeacher(mistake_rate=0.4, turn_end=" ")
    demos = teacher.demonstrations(300, seed=5, high=8, max_turns=4)
    for k, d in enumerate(demos):
        env = GuessNumber(high=8, max_turns=4)
        assert env.reset(seed=5 * 1_000_003 + k)[0] == d.prompt == "guess 1-8:"
        for i in range(0, len(d.turns), 2):
            assert d.turns[i].endswith(" ")
            obs, _, terminated, truncated, info = env.step(d.turns[i])
            last = i == len(d.turns) - 1
            assert (terminated or truncated) == last
            if not last:
                assert obs == d.turns[i + 1]
            else:
                assert info["won"] == d.correct


def test_a_rate_outside_zero_one_raises():
    with pytest.raises(ValueError, match="mistake_rate"):
        GuessTeacher(mistake_rate=1.5)
