"""The text environments: registry, the calculator task and its disjoint splits, guess-the-number."""

from __future__ import annotations

import pytest

from m2flow.envs.text import TEXT_ENVS, ToolEnv, make_text_env, register_text_env, text_env_names
from m2flow.envs.text.calculator import CalculatorTask, draw_problem, split_of
from m2flow.envs.text.guess import GuessNumber


def test_the_registry_lists_choices_and_refuses_duplicates():
    assert {"calculator", "guess_number", "gem", "reasoning_gym"} <= set(text_env_names())
    with pytest.raises(KeyError, match="unknown text environment 'chess'; valid names: calculator, gem"):
        make_text_env("chess")
    with pytest.raises(ValueError, match="already registered"):
        register_text_env("calculator")(GuessNumber)
    assert "calculator" in TEXT_ENVS


def test_the_calculator_task_rewards_the_exact_product_only():
    env = CalculatorTask()
    obs, info = env.reset(seed=3)
    a, b = (int(x) for x in obs.removesuffix("=").split("*"))
    assert 100 <= a <= 999 and 100 <= b <= 999 and info["answer"] == str(a * b)
    assert env.step(f" {a * b}\n")[1:4] == (1.0, True, False)
    for wrong in [str(a * b + 1), f"{a * b}.0", f"the answer is {a * b}", ""]:
        env.reset(seed=3)
        assert env.step(wrong)[1] == 0.0


def test_the_same_seed_gives_the_same_problem_and_the_splits_never_share_one():
    assert CalculatorTask().reset(seed=11) == CalculatorTask().reset(seed=11)
    train = {draw_problem(s, split="train") for s in range(400)}
    test = {draw_problem(s, split="test") for s in range(400)}
    assert not train & test
    assert all(split_of(*p) == "test" for p in test) and all(split_of(*p) == "train" for p in train)


def test_the_registered_calculator_answers_tool_calls_then_takes_the_answer():
    env = make_text_env("calculator", split="test", max_calls=2)
    assert isinstance(env, ToolEnv)
    obs, _ = env.reset(seed=0)
    expression = obs.removesuffix("=")
    product = str(eval(expression))  # noqa: S307 - the test's own digits
    assert env.step(f"<tool>calculator: {expression}</tool>") == (
        f"<result>{product}</result>", 0.0, False, False, {"tool": "calculator", "tool_outcome": "ok"})
    assert env.step(product)[1:3] == (1.0, True)
    env.reset(seed=0)
    assert env.step("<tool>calculator: 1+1</tool>")[3] is False
    assert env.step("<tool>calculator: 1+1</tool>")[3] is False  # the second call is the last answered
    assert env.step("<tool>calculator: 1+1</tool>") == ("<error>no calls left (at most 2)</error>", 0.0, False, True,
                                                       {"tool_outcome": "over_limit"})


def test_guess_the_number_by_bisection_wins_with_fewer_penalties():
    env = GuessNumber(high=100, max_turns=10, turn_penalty=0.05)
    env.reset(seed=5)
    low, high, total, turns = 1, 100, 0.0, 0
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(f"I guess {guess}")
        total, turns = total + reward, turns + 1
        if terminated:
            break
        assert not truncated and obs in ("higher", "lower")
        low, high = (guess + 1, high) if obs == "higher" else (low, guess - 1)
    assert info["won"] and turns <= 7 and total == pytest.approx(1.0 - 0.05 * (turns - 1))


def test_guess_the_number_answers_a_turn_without_a_number_and_truncates_at_its_limit():
    env = GuessNumber(high=10, max_turns=2)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("hmm")
    assert (obs, terminated, truncated, info["valid"]) == ("a number?", False, False, False) and reward < 0
    secret = env.secret
    assert env.step(str(secret % 10 + 1))[3] is True  # a wrong guess on the last turn
    assert GuessNumber().reset(seed=9) == GuessNumber().reset(seed=9)


def test_the_calculator_tool_latency_is_an_env_setting_drawn_per_episode_seed(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr("m2flow.rewards.tools.registry.time.sleep", waits.append)
    env = make_text_env("calculator", tool_latency_s=[0.0, 0.05])

    def episode(seed: int) -> list[float]:
        waits.clear()
        env.reset(seed=seed)
        env.step("<tool>calculator: 2*3</tool>")
        env.step("<tool>calculator: 4*5</tool>")
        return list(waits)

    first = episode(3)
    assert len(first) == 2 and all(0.0 <= w <= 0.05 for w in first) and first[0] != first[1]
    assert episode(3) == first  # an episode's waits follow its seed
    assert episode(4) != first
    with pytest.raises(ValueError, match="tool_latency_s"):
        make_text_env("calculator", tool_latency_s=[0.05])
