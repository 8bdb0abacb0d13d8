"""Package names that load on first use (PEP 562), so importing a package costs only what is used.

A package lists where each name lives and takes its module ``__getattr__`` and ``__dir__`` from here::

    __getattr__, __dir__ = lazy_names(__name__, {"Name": "submodule", ...})

A home is a submodule of the package (``"cluster"``) or a full module path (``"m2flow.models.vla"``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: a listed name is read from its home, which is imported
    on first use; the package keeps no copy, so the name is always the home's current one."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = home if home.startswith("m2flow.") else f"{package}.{home}"
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
