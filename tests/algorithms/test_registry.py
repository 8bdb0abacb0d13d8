"""Registries fail loudly: duplicates raise, unknown names list the valid ones sorted."""

from __future__ import annotations

import pytest

import m2flow.algorithms as algorithms
from m2flow.algorithms.registry import Registry, UnknownNameError


def test_register_get_and_list():
    reg: Registry[object] = Registry("widget")

    @reg.register("zeta")
    def zeta() -> int:
        return 1

    reg.add("alpha", len)
    assert reg.get("zeta") is zeta and reg["alpha"] is len
    assert reg.names() == ["alpha", "zeta"] and list(reg) == ["alpha", "zeta"]
    assert "zeta" in reg and "beta" not in reg and len(reg) == 2


def test_duplicate_name_raises_value_error():
    reg: Registry[object] = Registry("widget")
    reg.add("a", 1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.add("a", 2)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: None)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", 3)


def test_unknown_name_lists_valid_names_sorted():
    reg: Registry[object] = Registry("widget")
    for name in ("c", "a", "b"):
        reg.add(name, name)
    with pytest.raises(UnknownNameError) as info:
        reg.get("d")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value) == "unknown widget 'd'; valid names: a, b, c"
    assert "(none registered)" in str(pytest.raises(KeyError, Registry("empty").get, "x").value)


def test_package_registries_list_their_built_ins():
    assert algorithms.ADV_ESTIMATORS.names() == [
        "dr_grpo", "gae", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo",
    ]
    assert algorithms.POLICY_LOSSES.names() == ["decoupled_ppo", "ppo", "vanilla"]
    assert algorithms.KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    assert algorithms.LOSS_AGGREGATIONS.names() == [
        "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean",
    ]


def test_a_declared_name_is_known_at_once_and_loaded_from_its_home_on_use():
    reg: Registry[object] = Registry("widget", {"fn": "m2flow.algorithms.masked", "gone": "m2flow.algorithms.groups"})
    assert reg.names() == ["fn", "gone"] and "fn" in reg and len(reg) == 2  # nothing imported to say so
    with pytest.raises(ValueError, match=r"widget 'fn' is already registered \(declared in m2flow.algorithms.masked\)"):
        reg.add("fn", len)  # another module may not take a declared name
    with pytest.raises(ImportError, match="did not register the widget 'gone'"):
        reg.get("gone")  # its home imports, yet registers nothing


def test_every_declared_built_in_is_registered_by_its_home():
    from m2flow.backends.generation.registry import GENERATION_BACKENDS
    from m2flow.backends.training.registry import STRATEGIES
    from m2flow.envs.text.base import TEXT_ENVS
    from m2flow.models.policy_config import ENCODERS

    # get() imports a declared name's home, which must register it (add() refuses it from any other module).
    for reg in (algorithms.ADV_ESTIMATORS, algorithms.POLICY_LOSSES, algorithms.KL_ESTIMATORS,
                algorithms.LOSS_AGGREGATIONS, GENERATION_BACKENDS, STRATEGIES, TEXT_ENVS, ENCODERS):
        for name in reg.names():
            assert callable(reg.get(name)), (reg.kind, name)
