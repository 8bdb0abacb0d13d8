"""The one exception type every configuration problem is reported as."""

from __future__ import annotations

from m2flow.errors import UserInputError


class ConfigError(UserInputError):
    """A configuration problem, reported as ``"<dotted.key>: <reason>"``.

    ``key`` is the dotted path of the offending entry (``""`` for the whole config or the file);
    ``reason`` is the message without the key. The CLI prints ``str(error)`` on one line.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}" if key else reason)


class InputError(UserInputError):
    """A file, record or path the user gave that cannot be used; the message names it (file, line, key).

    Raised where the input is read (data files, checkpoints, model directories); the CLI prints it as
    one ``error:`` line, like a ``ConfigError``.
    """


def join_key(parent: str, child: str | int) -> str:
    """Dotted path of ``child`` under ``parent``; list indices render as ``parent[3]``."""
    if isinstance(child, int):
        return f"{parent}[{child}]"
    return f"{parent}.{child}" if parent else child
