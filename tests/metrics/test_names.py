"""Metric names: the known prefixes, the warn/error policy, and conversion of values to numbers."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from m2flow.metrics.names import (
    KNOWN_PREFIXES,
    MetricNameError,
    NameChecker,
    json_safe,
    prefix_of,
    scalars,
    to_scalar,
)


def test_prefix_of():
    assert prefix_of("actor/pg_loss") == "actor"
    assert prefix_of("channel/rollout/depth") == "channel"
    assert prefix_of("loss") == ""


def test_the_workflow_groups_are_known():
    for p in ("rollout", "actor", "env", "reward", "time", "perf"):
        assert p in KNOWN_PREFIXES


def test_unknown_prefix_warns_once_per_name(caplog):
    checker = NameChecker("warn")
    with caplog.at_level(logging.WARNING, logger="m2flow.metrics.names"):
        for _ in range(3):
            checker.check("loss")
            checker.check("actor/loss")
            checker.check("actor/")  # a group with no name is not a metric name
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "'loss'" in messages[0] and "actor/" in messages[0] and "time/" in messages[0]


def test_unknown_prefix_raises_in_error_mode_and_extra_prefixes_admit_a_group():
    checker = NameChecker("error", extra_prefixes=("runtime_demo/",))
    checker.check("runtime_demo/mean")
    checker.check("reward/mean")
    with pytest.raises(MetricNameError, match="'losses/approx_kl'.*actor/"):
        checker.check("losses/approx_kl")
    with pytest.raises(ValueError, match="'warn' or 'error'"):
        NameChecker("ignore")


def test_values_become_plain_numbers():
    assert to_scalar("a/x", True) == 1 and isinstance(to_scalar("a/x", True), int)
    assert to_scalar("a/x", 3) == 3
    assert to_scalar("a/x", np.float32(0.5)) == 0.5
    assert to_scalar("a/x", torch.tensor(2.5)) == 2.5
    assert to_scalar("a/x", torch.tensor([7])) == 7
    assert scalars({"a/x": np.int64(4), "a/y": 1.5}) == {"a/x": 4, "a/y": 1.5}
    with pytest.raises(TypeError, match="'a/x' must be a scalar"):
        to_scalar("a/x", torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="'a/x' must be a number, got str"):
        to_scalar("a/x", "high")


def test_json_safe_maps_non_finite_to_none():
    assert json_safe(math.nan) is None and json_safe(-math.inf) is None
    assert json_safe(1.5) == 1.5 and json_safe(3) == 3
