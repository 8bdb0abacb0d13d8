"""Memory per device of a plan: the one rule the search's bound and the built Plan's check both apply.

On each device class, every member's bytes per rank (``ComponentCost.memory`` of the items it holds
at once, times its ranks per device) add up, except:

* a model holder fused into another holder (the rollout inside the actor) uses its host's weights:
  its weights (``ComponentCost.shared_bytes``: its ``weight_bytes``) are not counted a second time,
  the rest of its ``mem_fixed`` (a KV-cache pool, buffers) and its per-item bytes are;
* process groups that offload take turns on the memory: the state each one moves (``Placed.moves``:
  its own, or the policy fused into the env processes) is resident for one of them at a time, so
  only the largest counts; everything else stays resident.

The structure (who is on which class, who moves what) depends on the shape of a plan, not on its
rank counts, so ``MemoryCheck`` reads it once and then prices any rank counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from m2flow.planner.cost import CostModel
from m2flow.planner.setup import SimSetup


@dataclass(frozen=True)
class _Class:
    label: str
    members: tuple[str, ...]
    per_device: Mapping[str, float]
    turns: tuple[tuple[str, ...], ...]
    """per offloading group on the class: the members whose bytes take turns"""


class MemoryCheck:
    """Bytes per device of every class of one setup's structure, for any rank counts."""

    def __init__(self, setup: SimSetup) -> None:
        comps = setup.components
        self.weightless = frozenset(c for c, p in comps.items() if p.weights_in_host)
        self.classes = []
        for k in setup.classes:
            members = tuple(sorted(k.members))
            turns = tuple(tuple(m for m in p.moves if m in k.members) for c, p in comps.items()
                          if c in k.members and p.offload and p.moves)
            self.classes.append(_Class(k.label, members, dict(k.ranks_per_device), turns))

    def member_bytes(self, cost: CostModel, name: str, items: float, ranks: int) -> float:
        """Bytes per rank of ``name`` holding ``items`` over ``ranks`` ranks (weights counted once)."""
        c = cost.component(name)
        fixed = c.mem_fixed - c.shared_bytes() if name in self.weightless else c.mem_fixed
        return fixed + c.mem_per_item * items / ranks

    def _class_bytes(self, cost: CostModel, k: _Class, held: Mapping[str, float],
                     ranks: Mapping[str, int]) -> tuple[float, dict[str, float]]:
        parts = {c: self.member_bytes(cost, c, held[c], ranks[c]) * k.per_device.get(c, 1.0) for c in k.members}
        moving = {c for unit in k.turns for c in unit}
        total = sum(v for c, v in parts.items() if c not in moving)
        total += max((sum(parts[c] for c in unit) for unit in k.turns), default=0.0)
        return total, parts

    def evaluate(self, cost: CostModel, held: Mapping[str, float],
                 ranks: Mapping[str, int]) -> tuple[dict[str, float], str]:
        """Bytes per device of each class, and why it does not fit (empty when it does); ``held``: the
        items each component holds at once."""
        out, why = {}, ""
        for k in self.classes:
            total, parts = self._class_bytes(cost, k, held, ranks)
            out[k.label] = total
            if total > cost.device_memory and not why:
                detail = ", ".join(f"{c} {v / 2**30:.1f}" for c, v in parts.items())
                why = (f"devices {k.label} need {total / 2**30:.1f} GiB each ({detail}), more than the "
                       f"{cost.device_memory / 2**30:.1f} GiB they have")
        return out, why

    def fits(self, cost: CostModel, held: Mapping[str, float], ranks: Mapping[str, int]) -> bool:
        """Whether every class fits (``evaluate`` without the report: the search asks this of every split)."""
        if math.isinf(cost.device_memory):
            return True
        return all(self._class_bytes(cost, k, held, ranks)[0] <= cost.device_memory for k in self.classes)
