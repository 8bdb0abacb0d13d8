"""The command-line's registry, a leaf: subcommands register here, and ``cli.py`` builds the parser from it.

Modules that add subcommands (those ``cli.COMMAND_MODULES`` names, or a ``m2flow.commands`` entry point of
an installed package) import only this module, never ``cli.py``: nothing under the command line imports it
back. Such modules must stay light to import: heavy imports (torch, ray) go inside the ``run`` function,
so ``m2flow --help`` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "m2flow.commands"


class CommandError(Exception):
    """A subcommand's refusal: ``main`` prints ``error: <message>`` and exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Command:
    """One subcommand: ``configure_parser`` adds its arguments, ``run(args)`` returns the exit code."""

    name: str
    help: str
    configure_parser: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}
_PLUGINS_LOADED = False


def say(text: str) -> None:
    """One line of a command's output on stdout: subcommands print through here, library modules log."""
    print(text)


def register_command(
    name: str,
    help: str,
    configure_parser: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> Command:
    """Add subcommand ``name``; registering a name twice raises ValueError."""
    if name in COMMANDS:
        raise ValueError(f"m2flow subcommand {name!r} is already registered")
    command = Command(name, help, configure_parser, run)
    COMMANDS[name] = command
    return command


def unregister_command(name: str) -> None:
    """Remove subcommand ``name`` (for tests); unknown names raise KeyError."""
    del COMMANDS[name]


def registered_commands() -> list[str]:
    """Names of the registered subcommands, sorted."""
    return sorted(COMMANDS)


def load_plugins(modules: Sequence[str] = ()) -> None:
    """Import ``modules`` (each registers its own subcommands) and every ``m2flow.commands`` entry point, once."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    loaders: list[tuple[str, Callable[[], object]]] = [
        (m, lambda m=m: importlib.import_module(m)) for m in modules
    ]
    loaders += [(ep.value, ep.load) for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    for origin, load in loaders:
        try:
            loaded = load()
            if callable(loaded):  # an entry point may name a register() function
                loaded()
        except Exception as error:  # noqa: BLE001 - one broken plug-in must not disable the CLI
            log.warning("could not load m2flow commands from %s: %s", origin, error)
