"""The training strategies by config name (``actor.strategy``), and what each is, known without importing one.

A built-in strategy is declared here with the module that defines it and its `StrategyTraits`; that
module (torch.distributed) is imported only when the class is asked for, so configs and the planner
read whether a strategy shards at no import cost. `register_strategy` gives a declared class its
declared traits; a strategy registered from elsewhere states them as class attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from m2flow.algorithms.registry import Registry

__all__ = ["STRATEGIES", "StrategyTraits", "register_strategy", "strategy_traits"]


@dataclass(frozen=True)
class StrategyTraits:
    """What a training strategy is, read before one is built (the class attributes of the same names)."""

    sharded: bool
    """Each rank holds a shard of the state: checkpoints are written per rank (``sharded_state``)."""
    lockstep: bool
    """Every forward pass is a collective: all ranks must run the same number of micro-batches."""


_BUILT_IN: dict[str, tuple[str, StrategyTraits]] = {
    "ddp": ("m2flow.backends.training.ddp", StrategyTraits(sharded=False, lockstep=False)),
    # FSDP's forward passes all-gather the weights.
    "fsdp": ("m2flow.backends.training.fsdp", StrategyTraits(sharded=True, lockstep=True)),
}
"""Config name -> (the module that registers the strategy, its traits)."""

STRATEGIES: Registry[Callable[..., Any]] = Registry(
    "training strategy", {name: home for name, (home, _) in _BUILT_IN.items()})
"""Strategy name -> class, the built-in ones loaded on first use; `factory.create_strategy` chooses among them."""

_S = TypeVar("_S", bound=type)


def register_strategy(name: str) -> Callable[[_S], _S]:
    """Class decorator adding a strategy under ``name``; a taken name raises. A built-in one gets its
    declared traits as class attributes."""

    def deco(cls: _S) -> _S:
        STRATEGIES.add(name, cls)
        if name in _BUILT_IN:
            for trait, value in asdict(_BUILT_IN[name][1]).items():
                setattr(cls, trait, value)
        return cls

    return deco


def strategy_traits(name: str) -> StrategyTraits:
    """What the strategy registered as ``name`` is: declared for a built-in one (nothing imported), else its
    class attributes; an unknown name raises ValueError listing the valid ones."""
    if name in _BUILT_IN:
        return _BUILT_IN[name][1]
    if name not in STRATEGIES:
        raise ValueError(f"unknown training strategy {name!r}; valid: {sorted(STRATEGIES)}")
    cls = STRATEGIES[name]
    return StrategyTraits(**{trait: bool(getattr(cls, trait)) for trait in StrategyTraits.__dataclass_fields__})
