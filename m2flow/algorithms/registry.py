"""Name -> implementation registries that fail loudly (duplicates raise, unknown names list choices)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """Raised for a name no one registered; it is both a KeyError and a ValueError."""

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0])


class Registry(Generic[T]):
    """A named collection of implementations of one kind, filled with ``@REG.register("name")``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

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
        self._entries[name] = obj

    def get(self, name: str) -> T:
        """The implementation registered under ``name``; an unknown name lists the valid ones."""
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names()) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


ADV_ESTIMATORS: Registry[Callable[..., object]] = Registry("advantage estimator")
POLICY_LOSSES: Registry[Callable[..., object]] = Registry("policy loss")
KL_ESTIMATORS: Registry[Callable[..., object]] = Registry("KL estimator")
LOSS_AGGREGATIONS: Registry[Callable[..., object]] = Registry("loss aggregation")
