"""``PlanChoice``: one execution plan as the search states it, in the Plan's own terms.

The search enumerates, simulates and ranks choices; a choice becomes a ``Plan`` through the one
builder (``build.build_plan``): under a workflow's constraints (``Workflow.plan(cfg, layout, choice)``)
or, for a bare search space, its own (``candidate_plan.plan_of``). A choice names no config key: its settings are keyed by the names the
Plan gives them (``prompts_per_chunk``, ``pipeline_stages``, a micro-batch size), its fusions are
(component, host) pairs of the graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class PlanChoice:
    """Where each component runs, which fusions are taken, and the values of the settings the search varies."""

    placement: str
    """each component's devices: the shape (which components share a block) and the device split, as a
    placement string (``"gen: 0, train: 1-3"``, ``"all"``, ``"local"``)"""
    fusions: tuple[tuple[str, str], ...] = ()
    """(component, host) pairs taken: the component runs inside its host's processes; any other fusion the
    search may take is not"""
    settings: tuple[tuple[str, Any], ...] = ()
    """(plan setting, value) of every setting the search varies, by the Plan's own setting names"""

    def __post_init__(self) -> None:
        # One order, so that two choices of the same plan are equal and hash alike.
        object.__setattr__(self, "fusions", tuple(sorted(self.fusions)))
        object.__setattr__(self, "settings", tuple(sorted(self.settings)))

    @classmethod
    def of(cls, placement: str, fusions: Iterable[tuple[str, str]] = (),
           settings: Mapping[str, Any] | None = None) -> PlanChoice:
        """A choice from a placement, the fusions taken and a mapping of setting values."""
        return cls(placement, tuple(fusions), tuple((settings or {}).items()))

    @property
    def values(self) -> dict[str, Any]:
        """plan setting -> its chosen value."""
        return dict(self.settings)

    def fused(self, component: str, host: str) -> bool:
        """Whether ``component`` runs inside ``host``'s processes under this choice."""
        return (component, host) in self.fusions

    def at(self, placement: str) -> PlanChoice:
        """The same choice on another placement (``"local"`` for a one-device plan run in the driver)."""
        return replace(self, placement=placement)

    def describe(self) -> str:
        """The fusions and settings in a few words (the placement left out)."""
        parts = [f"{c} fused into {h}" for c, h in self.fusions] or ["nothing fused"]
        parts += [f"{name} {value}" for name, value in self.settings]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """JSON values: ``{"placement": ..., "fusions": [[component, host], ...], "settings": {...}}``."""
        return {"placement": self.placement, "fusions": [list(pair) for pair in self.fusions],
                "settings": self.values}
