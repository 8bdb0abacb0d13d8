"""Cost model: fits recover known curves, contention slows shared cores, stale or foreign profiles are refused."""

from __future__ import annotations

import json

import pytest

from m2flow.planner.cost import ComponentCost, CostModel, Link, fit_component
from m2flow.planner.profile_file import ProfileError, config_hash, load_profile, new_profile

MACHINE = {"hostname": "box", "cores": 2, "torch": "2.5.1", "m2flow": "0.1.0"}


def test_fit_recovers_a_known_curve_exactly():
    true = ComponentCost(a=0.5, c=0.02, alpha=0.8, s=0.1)
    points = [(b, d, true.time(b, d)) for b in (8, 32, 128) for d in (1, 2, 4)]
    fit = fit_component(points)
    assert fit.cost.alpha == pytest.approx(0.8)
    assert fit.cost.a == pytest.approx(0.5, rel=1e-6) and fit.cost.c == pytest.approx(0.02, rel=1e-6)
    assert fit.cost.s == pytest.approx(0.1, rel=1e-6)
    assert fit.error < 1e-9 and fit.points == 9


def test_fit_reports_its_error_on_noisy_points():
    points = [(10, 1, 1.1), (20, 1, 1.9), (40, 1, 4.2)]
    fit = fit_component(points)
    assert fit.cost.alpha == 1.0  # one device count: scaling cannot be told
    assert 0.0 < fit.error < 0.1
    with pytest.raises(ValueError, match="at least one"):
        fit_component([])


def test_memory_transfer_and_contention():
    cost = ComponentCost(mem_fixed=100.0, mem_per_item=2.0)
    assert cost.memory(50, 2) == 150.0
    assert Link(bandwidth=1e6, latency=0.01).transfer(1e6) == pytest.approx(1.01)
    model = CostModel({"x": cost}, cores=2)
    assert model.speed(1) == 1.0 and model.speed(2) == 1.0 and model.speed(4) == 0.5
    assert CostModel({"x": cost}).speed(64) == 1.0  # devices without shared cores


def _write(tmp_path, **changes):
    profile = new_profile("toy", config_hash({"a": 1, "placement": "all"}, ignore=("placement",)),
                          {"gen": {"points": [[8, 1, 1.0], [16, 1, 1.8]], "mem_fixed": 10},
                           "train": {"a": 0.1, "c": 0.01}}, machine=MACHINE,
                          device={"memory_bytes": 1000, "cores": 2})
    profile.update(changes)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return path


def test_profile_loads_on_its_own_machine_and_config(tmp_path):
    cfg_hash = config_hash({"a": 1, "placement": "1-3"}, ignore=("placement",))
    model = load_profile(_write(tmp_path), "toy", cfg_hash, MACHINE)
    assert model.component("gen").mem_fixed == 10 and model.component("train").c == 0.01
    assert model.device_memory == 1000 and model.cores == 2


def test_stale_or_foreign_profiles_are_refused(tmp_path):
    path = _write(tmp_path)
    good = config_hash({"a": 1}, ignore=())
    with pytest.raises(ProfileError, match="foreign: taken with hostname 'box'"):
        load_profile(path, "toy", good, {**MACHINE, "hostname": "other"})
    with pytest.raises(ProfileError, match="stale: taken with torch"):
        load_profile(path, "toy", good, {**MACHINE, "torch": "2.6.0"})
    with pytest.raises(ProfileError, match="stale: taken on a config with hash"):
        load_profile(path, "toy", config_hash({"a": 2}), MACHINE)
    with pytest.raises(ProfileError, match="profiles workflow 'toy'"):
        load_profile(path, "other", good, MACHINE)
    with pytest.raises(ProfileError, match="no profile file"):
        load_profile(tmp_path / "missing.json", "toy", good, MACHINE)
