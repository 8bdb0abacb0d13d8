"""What a tool is: a name, a one-line description for prompts, and a call from argument text to output text.

A tool may also declare ``parameters``, the JSON schema of its arguments, for the function-schema form
chat templates read (``schema.py``); without one it takes a single string, ``argument``.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable


class ToolTimeout(TimeoutError):
    """A tool gave no result within its time limit."""


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call as ``<tool>NAME: ARGUMENT</tool>``; raising is a failed call, never a crash."""

    name: str
    """The name the model writes in its call."""
    description: str
    """One line, for the prompt that tells the model which tools it has."""
    isolated: ClassVar[bool]
    """Whether the tool enforces its own time limit in a process it can kill (else `ToolBox` runs it
    under a thread deadline)."""

    def __call__(self, argument: str) -> str:
        """The output text for one call's argument."""
        ...
