"""The optional GEM and reasoning-gym adapters: run when the extra is installed, a clear error when not."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from m2flow.envs.text import make_text_env
from m2flow.envs.text.adapters import require


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "gem", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=r"optional extra 'gem': pip install 'm2flow\[gem\]'"):
        require("gem", "gem")
    with pytest.raises(ImportError, match="optional extra 'gem'"):
        make_text_env("gem", env_id="game:GuessTheNumber-v0-easy")


@pytest.mark.skipif(importlib.util.find_spec("gem") is None or importlib.util.find_spec("requests") is None,
                    reason="the 'gem' extra is not installed")
def test_a_gem_guess_the_number_episode_runs_through_the_adapter():
    env = make_text_env("gem", env_id="game:GuessTheNumber-v0-easy")
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and obs and isinstance(info, dict)
    obs, reward, terminated, truncated, info = env.step("\\boxed{5}")
    assert isinstance(obs, str) and isinstance(reward, float) and isinstance(terminated, bool)
    assert make_text_env("gem", env_id="game:GuessTheNumber-v0-easy").reset(seed=0)[0] == env.reset(seed=0)[0]


@pytest.mark.skipif(importlib.util.find_spec("gem") is None or importlib.util.find_spec("requests") is None,
                    reason="the 'gem' extra is not installed")
def test_a_gem_sudoku_episode_runs_through_the_adapter():
    env = make_text_env("gem", env_id="game:Sudoku-v0-easy")
    obs, _ = env.reset(seed=1)
    assert "sudoku" in obs.lower() or "grid" in obs.lower()
    assert isinstance(env.step("\\boxed{1 1 1}")[1], float)


@pytest.mark.skipif(importlib.util.find_spec("gem") is None or importlib.util.find_spec("requests") is None,
                    reason="the 'gem' extra is not installed")
def test_gem_wrappers_add_its_python_tool_and_unknown_ones_are_refused():
    env = make_text_env("gem", env_id="game:GuessTheNumber-v0-easy", wrappers="python_tool")
    env.reset(seed=0)
    obs, reward, terminated, _, _ = env.step("<python>print(6*7)</python>")
    assert "42" in obs and not terminated
    with pytest.raises(ValueError, match="unsupported GEM wrapper 'concat_chat'"):
        make_text_env("gem", env_id="game:GuessTheNumber-v0-easy", wrappers="concat_chat")


@pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="the 'reasoning-gym' extra is not installed")
def test_a_reasoning_gym_task_is_one_scored_question_per_seed():
    env = make_text_env("reasoning_gym", task="basic_arithmetic")
    obs, info = env.reset(seed=4)
    assert obs == make_text_env("reasoning_gym", task="basic_arithmetic").reset(seed=4)[0]
    _, right, terminated, _, _ = env.step(info["answer"])
    env.reset(seed=4)
    _, wrong, _, _, _ = env.step("not an answer")
    assert terminated and right == 1.0 and wrong < 1.0
