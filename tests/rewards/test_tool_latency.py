"""The tool latency distributions: seeded, within their bounds, heavy-tailed where asked, bad specs refused."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs.text import make_text_env
from m2flow.rewards.tools.latency import ToolLatency, parse_latency

LOGNORMAL = {"dist": "lognormal", "median_s": 0.02, "sigma": 1.5, "max_s": 0.5}
PARETO = {"dist": "pareto", "scale_s": 0.01, "alpha": 1.1, "max_s": 0.5}


def draws(spec, seed: int, n: int = 4000) -> np.ndarray:
    latency = parse_latency(spec)
    rng = np.random.default_rng(seed)
    return np.array([latency.draw(rng) for _ in range(n)])


@pytest.mark.parametrize("spec", [LOGNORMAL, PARETO])
def test_a_heavy_tailed_latency_is_seeded_capped_and_its_slowest_calls_take_a_large_share(spec):
    waits = draws(spec, seed=3)
    assert np.array_equal(waits, draws(spec, seed=3)) and not np.array_equal(waits, draws(spec, seed=4))
    assert waits.min() >= 0.0 and waits.max() == 0.5  # the cap is reached and never passed
    assert np.median(waits) < 0.05  # most calls are short
    top = np.sort(waits)[-len(waits) // 20:]
    assert top.sum() / waits.sum() > 0.3  # the slowest 5% of calls take over 30% of the total wait
    assert (waits > 0.4).mean() < 0.06  # and only a few come near the cap


def test_the_uniform_form_is_the_low_high_pair():
    assert parse_latency([0.01, 0.05]) == ToolLatency("uniform", max_s=0.05, low_s=0.01)
    waits = draws([0.01, 0.05], seed=0, n=500)
    assert waits.min() >= 0.01 and waits.max() <= 0.05
    top = np.sort(waits)[-25:]
    assert top.sum() / waits.sum() < 0.1  # no tail: the slowest 5% take about their share
    assert parse_latency(None) is None


@pytest.mark.parametrize("spec, message", [
    ({"dist": "gamma", "max_s": 0.5}, "dist must be one of"),
    ({"dist": "lognormal", "median_s": 0.02}, "needs max_s"),
    ({"dist": "pareto", "alpha": 1.5, "sigma": 1.0, "max_s": 0.5}, r"not \['sigma'\]"),
    ({"dist": "pareto", "alpha": 0.0, "max_s": 0.5}, "alpha > 0"),
    ({"dist": "lognormal", "median_s": 0.02, "max_s": -1.0}, "low_s <= max_s"),
    ([0.05], r"\[low, high\]"),
    ([0.3, 0.1], "0 <= low <= high"),
])
def test_a_bad_latency_spec_raises_one_line_naming_it(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_latency(spec)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="^tool_latency_s: "):
        make_text_env("calculator", tool_latency_s=spec)


def test_the_calculator_waits_follow_a_heavy_tailed_latency_per_episode_seed(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr("m2flow.rewards.tools.registry.time.sleep", waits.append)
    env = make_text_env("calculator", tool_latency_s=LOGNORMAL, max_calls=None)

    def episode(seed: int) -> list[float]:
        waits.clear()
        env.reset(seed=seed)
        for _ in range(20):
            env.step("<tool>calculator: 2*3</tool>")
        return list(waits)

    first = episode(5)
    assert len(first) == 20 and all(0.0 <= w <= 0.5 for w in first)
    assert episode(5) == first and episode(6) != first
