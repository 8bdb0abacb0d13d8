"""Metric names: grouped by prefix (``actor/pg_loss``), checked against the known groups.

Policy on an unknown prefix: **warn once per name** by default, raise with ``unknown_prefix="error"``.
A metric under an unexpected group still logs correctly, so a typo should not stop a long run at
step 900; strict mode exists for tests and CI, where a new name should be a deliberate choice.
``extra_prefixes`` admits a component's own group (the runtime demo logs ``runtime_demo/``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

log = logging.getLogger(__name__)

# The groups metrics are filed under. The first six are the workflow's; critic/, channel/ and eval/
# are produced by the PPO critic, the channel layer and evaluation runs; async/ by bounded staleness;
# tool/ by agentic tool calls; faults/ by the driver (restarts after a worker death).
KNOWN_PREFIXES = ("rollout", "actor", "critic", "env", "reward", "tool", "time", "perf", "channel", "eval", "async",
                  "faults")

UnknownPrefixPolicy = Literal["warn", "error"]


class MetricNameError(ValueError):
    """A metric name outside the known groups, under ``unknown_prefix="error"``."""


def prefix_of(name: str) -> str:
    """The group of a metric name: ``"actor"`` for ``"actor/pg_loss"``, ``""`` when there is none."""
    head, sep, _ = name.partition("/")
    return head if sep else ""


class NameChecker:
    """Checks each metric name once against the known prefixes, under a warn or error policy."""

    def __init__(self, policy: UnknownPrefixPolicy = "warn", extra_prefixes: Iterable[str] = ()) -> None:
        if policy not in ("warn", "error"):
            raise ValueError(f"unknown_prefix must be 'warn' or 'error', got {policy!r}")
        self.policy = policy
        self.prefixes = frozenset(KNOWN_PREFIXES) | {p.strip("/") for p in extra_prefixes}
        self._seen: set[str] = set()

    def check(self, name: str) -> None:
        """Raise or warn (once) when ``name`` has no known ``prefix/``."""
        if name in self._seen:
            return
        if prefix_of(name) not in self.prefixes or name.endswith("/"):
            message = (f"metric {name!r} is not under a known prefix; use one of "
                       f"{', '.join(p + '/' for p in sorted(self.prefixes))}")
            if self.policy == "error":
                raise MetricNameError(message)
            log.warning(message)
        self._seen.add(name)


def to_scalar(name: str, value: Any) -> float | int:
    """A plain Python number from an int, float, bool, numpy scalar or one-element tensor."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            out = item()
        except (ValueError, RuntimeError) as e:  # a tensor or array with more than one element
            raise TypeError(f"metric {name!r} must be a scalar, got {type(value).__name__} ({e})") from None
        if isinstance(out, (bool, int, float)):
            return int(out) if isinstance(out, bool) else out
    raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}")


def scalars(metrics: Mapping[str, Any]) -> dict[str, float | int]:
    """Every value of ``metrics`` as a plain number (see ``to_scalar``)."""
    return {k: to_scalar(k, v) for k, v in metrics.items()}


def json_safe(value: float | int) -> float | int | None:
    """NaN and infinities become None: JSON has no literal for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
