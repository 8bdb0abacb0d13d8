"""The drift detector: sustained drift triggers it, noise and single slow iterations do not."""

from __future__ import annotations

import random

import pytest

from m2flow.planner.cost import ComponentCost, CostModel
from m2flow.planner.drift import DriftDetector, rescaled, worth_switching

PREDICTED = {"rollout": 0.20, "actor": 0.50, "reward": 0.01}


def _noisy(rng: random.Random, scale: dict[str, float] | None = None, sigma: float = 0.15) -> dict[str, float]:
    scale = scale or {}
    return {c: t * scale.get(c, 1.0) * rng.lognormvariate(0.0, sigma) for c, t in PREDICTED.items()}


def test_noise_and_single_spikes_never_trigger() -> None:
    rng = random.Random(0)
    det = DriftDetector(PREDICTED, threshold=0.5, window=4)
    for it in range(500):
        measured = _noisy(rng)
        if it % 37 == 5:  # one slow iteration now and then (a collection, a busy neighbour)
            measured["actor"] *= 4.0
        assert det.observe(measured) == [], f"false drift at iteration {it}: {det.drifts}"
    assert not det.drifting
    assert all(0.8 < r < 1.25 for r in det.ratios().values())


def test_injected_drift_triggers_within_the_window_and_names_the_component() -> None:
    rng = random.Random(1)
    det = DriftDetector(PREDICTED, threshold=0.5, window=4)
    for _ in range(20):
        assert det.observe(_noisy(rng)) == []
    started = []
    for it in range(20, 40):  # the actor becomes 2.5x slower and stays so
        started += det.observe(_noisy(rng, {"actor": 2.5}))
        if started:
            break
    assert [d.component for d in started] == ["actor"]
    assert it - 20 < 4  # within one window: the median flips once half of it is slow
    assert started[0].ratio == pytest.approx(2.5, rel=0.3)
    assert det.drifting and set(det.drifts) == {"actor"}


def test_a_faster_component_drifts_too_and_recovery_clears_it() -> None:
    det = DriftDetector(PREDICTED, threshold=0.5, window=3, warmup=0)
    for _ in range(3):
        det.observe({**PREDICTED, "rollout": 0.05})  # 4x faster than predicted
    assert set(det.drifts) == {"rollout"} and det.drifts["rollout"].ratio == pytest.approx(0.25)
    for _ in range(3):
        det.observe(PREDICTED)
    assert not det.drifting


def test_warmup_iterations_are_not_counted_and_missing_metrics_are_skipped() -> None:
    det = DriftDetector(PREDICTED, threshold=0.5, window=2, warmup=2)
    det.observe({"actor": 50.0})  # compilation, caches: ignored
    det.observe({"actor": 50.0})
    assert det.ratio("actor") is None and not det.drifting
    det.observe({"rollout": 0.2})  # the actor's metric absent: its window does not move
    assert det.ratio("actor") is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        DriftDetector(PREDICTED, threshold=0)
    with pytest.raises(ValueError, match="window"):
        DriftDetector(PREDICTED, window=0)


def test_rescaled_costs_and_the_switch_decision() -> None:
    cost = CostModel({"actor": ComponentCost(a=0.1, c=0.01, alpha=0.8, s=0.02, state_bytes=5.0),
                      "rollout": ComponentCost(a=0.2, c=0.02)})
    out = rescaled(cost, {"actor": 2.0, "missing": 3.0})
    assert out.component("actor").time(10, 2) == pytest.approx(2 * cost.component("actor").time(10, 2))
    assert out.component("actor").state_bytes == 5.0 and out.component("actor").alpha == 0.8
    assert out.component("rollout") == cost.component("rollout")
    # 0.5 s saved per iteration over 10 iterations = 5 s: worth a 3 s switch, not a 6 s one.
    assert worth_switching(2.0, 1.5, 10, 3.0).switch
    assert not worth_switching(2.0, 1.5, 10, 6.0).switch
    assert not worth_switching(1.5, 2.0, 100, 0.0).switch  # a slower plan is never a gain
    assert worth_switching(2.0, 1.5, 10, 3.0).gain_s == pytest.approx(5.0)
