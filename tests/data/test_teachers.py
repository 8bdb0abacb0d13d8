"""The teacher registry: the shipped teachers by name, one of your own, and the errors."""

from __future__ import annotations

import pytest

from m2flow.data.teachers import TEACHERS, Demonstration, TeachRequest, register_teacher, teach
from m2flow.workflows.agentic.config import WarmStartConfig


def test_the_shipped_teachers_are_registered_and_keep_their_tunables():
    assert {"calculator", "guess_number"} <= set(TEACHERS)
    skips = teach("calculator", TeachRequest(count=10, seed=0, warm_start=WarmStartConfig(skip_rate=1.0,
                                                                                          copy_error_rate=0.0)))
    assert {d.kind for d in skips} == {"skip"}
    guesses = teach("guess_number", TeachRequest(count=10, seed=0, env_kwargs={"high": 8, "max_turns": 4},
                                                 turn_end=";", warm_start=WarmStartConfig(mistake_rate=0.0)))
    assert all(d.correct and d.prompt == "guess 1-8:" for d in guesses)
    assert all(t.endswith(";") for d in guesses for t in d.turns[::2])


def test_an_unknown_teacher_lists_the_registered_ones():
    with pytest.raises(KeyError, match="unknown teacher 'nobody'; valid names: .*calculator.*guess_number"):
        teach("nobody", TeachRequest(count=1, seed=0))


def test_a_teacher_of_your_own_is_called_with_the_request_and_a_taken_name_raises():
    @register_teacher("test_echo_teacher")
    def echo(request: TeachRequest) -> list[Demonstration]:
        word = request.options["word"]
        return [Demonstration(f"say {word}", (word,), "echo", True)] * request.count

    demos = teach("test_echo_teacher", TeachRequest(count=3, seed=0, options={"word": "HI"}))
    assert demos == [Demonstration("say HI", ("HI",), "echo", True)] * 3
    with pytest.raises(ValueError, match="already registered"):
        register_teacher("test_echo_teacher")(echo)


def test_a_teacher_that_writes_the_wrong_shape_is_refused():
    @register_teacher("test_even_teacher")
    def even(request: TeachRequest) -> list[Demonstration]:
        return [Demonstration("p", ("a", "b"), "x", True)]

    with pytest.raises(ValueError, match="test_even_teacher.*odd number of turns"):
        teach("test_even_teacher", TeachRequest(count=1, seed=0))
