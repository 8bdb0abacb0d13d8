"""The hash a profile carries: a config without what only says how it executes.

The profiler and re-planning take everything else straight from the ``Workflow``: the timing metric
and threads key of every component and the fusion keys from its graph, probes, lengths, byte counts
and resumability from its hooks.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from m2flow.driver.run_config import RUN_KEYS


def profile_hash(cfg: Any, workflow: Any) -> str:
    """The hash a profile of ``cfg`` carries: the config without the workflow's execution keys (placement,
    cluster, fusion, threads and tunable keys: what the search varies or a plan decides), ``plan_file``
    and ``RUN_KEYS``."""
    from m2flow.planner.profile_file import config_hash

    ignore = ("placement", "cluster", "plan_file", *workflow.execution_keys(), *RUN_KEYS)
    return config_hash(asdict(cfg), ignore=tuple(dict.fromkeys(ignore)))
