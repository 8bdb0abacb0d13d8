"""Name -> implementation registries that fail loudly (duplicates raise, unknown names list choices).

A registry may know a name before its implementation is loaded: ``declared`` maps each built-in name to
the module that registers it, imported on the name's first use. Configs check names against a
registry without importing torch through the modules that implement them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """Raised for a name no one registered; it is both a KeyError and a ValueError."""

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0])


class Registry(Generic[T]):
    """A named collection of implementations of one kind, filled with ``@REG.register("name")``; a
    ``declared`` name (name -> the module that registers it) is known at once and loaded on first use."""

    def __init__(self, kind: str, declared: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._homes: dict[str, str] = dict(declared or {})

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that adds the decorated object under ``name``; a taken name raises ValueError."""

        def decorate(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorate

    def add(self, name: str, obj: T) -> None:
        """Add ``obj`` under ``name``; a taken name raises ValueError."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered (by {self._entries[name]!r})")
        home = self._homes.get(name)
        if home is not None and getattr(obj, "__module__", None) != home:
            # A declared name is its home module's: another one taking it would shadow the built-in.
            raise ValueError(f"{self.kind} {name!r} is already registered (declared in {home})")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        """The implementation registered under ``name`` (its home imported first when only declared); an
        unknown name lists the valid ones."""
        if name not in self._entries and name in self._homes:
            importlib.import_module(self._homes[name])  # registers it
            if name not in self._entries:
                raise ImportError(f"{self._homes[name]} did not register the {self.kind} {name!r} declared there")
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names()) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> list[str]:
        """Registered and declared names, sorted."""
        return sorted(self._entries.keys() | self._homes.keys())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._homes

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


def homes(module: str, *names: str) -> dict[str, str]:
    """``{name: module}`` for each of ``names``: the ``declared`` argument of a registry whose names one module registers."""
    return dict.fromkeys(names, module)


ADV_ESTIMATORS: Registry[Callable[..., object]] = Registry("advantage estimator", homes(
    "m2flow.algorithms.estimators", "gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"))
POLICY_LOSSES: Registry[Callable[..., object]] = Registry("policy loss", homes(
    "m2flow.algorithms.losses", "ppo", "vanilla", "decoupled_ppo"))
KL_ESTIMATORS: Registry[Callable[..., object]] = Registry("KL estimator", homes("m2flow.algorithms.kl", "k1", "k2", "k3"))
LOSS_AGGREGATIONS: Registry[Callable[..., object]] = Registry("loss aggregation", homes(
    "m2flow.algorithms.aggregation", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"))
