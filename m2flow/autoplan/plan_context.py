"""A config object as the planner needs it: its layout, its search space, its profile hash, and the
Plan of a candidate (the workflow's one builder on the ``PlanChoice``; no config key on the way).

``m2flow profile``, ``placement: auto`` and ``m2flow plan search`` (``search_command.py``) all start
from a loaded config (not a file), so candidates are configured from the config's own data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from m2flow.config import with_overrides
from m2flow.planner.choice import PlanChoice


def layout_of(cfg: Any) -> Any:
    """The device layout the config's cluster will have; attaching to a running cluster is refused."""
    from m2flow.config.errors import ConfigError
    from m2flow.runtime.cluster import expected_layout

    layout = expected_layout(cfg.cluster)
    if layout is None:
        raise ConfigError("cluster.address", "attaches to a running cluster whose devices are known only once "
                          "connected, and planning needs them first; plan without it (cluster.cpu_devices_per_node "
                          "sets the devices per node)")
    return layout


class PlanContext:
    """A workflow config, the device layout it plans for, its base plan and what a search may vary."""

    def __init__(self, spec: Any, cfg: Any, layout: Any = None) -> None:
        from m2flow.runtime.placement import PlacementError

        self.spec, self.cfg = spec, cfg
        self.given = cfg
        """the config as given (``placement: auto`` among it): the one a chosen Plan runs with"""
        self.layout = layout if layout is not None else layout_of(cfg)
        self.devices = sum(self.layout.devices_per_node)
        try:
            base = spec.plan(cfg, self.layout)
        except (PlacementError, ValueError):  # 'auto', or a placement that does not fit: start collocated
            self.cfg = self.configure({"placement": "all"})
            base = spec.plan(self.cfg, self.layout)
        self.base = base
        self.space = spec.search_space(self.cfg, base)

    def configure(self, changes: Mapping[str, Any]) -> Any:
        """The config with dotted ``changes`` applied, validated (the profiler's probes)."""
        return with_overrides(self.spec.schema, self.cfg, changes)

    def build(self, choice: PlanChoice) -> Any:
        """The validated Plan of ``choice``: the workflow's plan on the config's constraints (a ValueError refuses it)."""
        return self.spec.plan(self.cfg, self.layout, choice)

    def config_hash(self) -> str:
        from m2flow.autoplan.profile_hash import profile_hash

        return profile_hash(self.cfg, self.spec)
