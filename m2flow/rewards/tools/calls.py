"""The tool-call format: how a model asks for a tool in its text, and how a reply is written back.

A call is one tag, anywhere in a model turn (text before it is the model's own reasoning)::

    <tool>NAME: ARGUMENT</tool>

NAME is a registered tool's name (lower-case letters, digits, ``_``, starting with a letter); ARGUMENT
is everything between ``NAME:`` and the closing tag, leading and trailing whitespace stripped, and may
span lines (Python code). A turn ends at the closing tag: ``CALL_STOP`` is the stop string the
rollout generates with, so nothing follows a call in the same turn.

Parsing is strict, and every text gets exactly one outcome (``ParsedCall.status``):

- ``none``: no ``<tool>`` in the text: the turn is an answer to the environment, not a call;
- ``call``: exactly one well-formed tag;
- ``malformed``: an opening tag without its closing tag, a second opening tag, a closing tag without an
  opening one, no ``NAME:`` prefix, a name that is not an identifier, or an empty argument.

A tool's output reaches the model as ``<result>OUTPUT</result>``; a failed call (malformed, unknown
tool, raised, timed out) as ``<error>MESSAGE</error>``, so the model can read what went wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

CALL_OPEN = "<tool>"
CALL_CLOSE = "</tool>"
CALL_STOP = CALL_CLOSE
"""The stop string a model turn is generated with: a turn that calls a tool ends with its call."""
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ERROR_OPEN, ERROR_CLOSE = "<error>", "</error>"

ParseStatus = Literal["none", "call", "malformed"]
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class ParsedCall:
    """What a model turn's text holds: no call, one call (``name``, ``argument``), or a malformed one (``error``)."""

    status: ParseStatus
    name: str = ""
    argument: str = ""
    error: str = ""
    arguments: dict[str, Any] | None = None
    """A schema-form call's arguments object (``formats.py``), checked against the tool's schema by the box;
    None for a tag call, whose ``argument`` is the text itself."""


def format_call(name: str, argument: str) -> str:
    """The text of a call, e.g. ``<tool>calculator: 123*456</tool>``."""
    return f"{CALL_OPEN}{name}: {argument}{CALL_CLOSE}"


def format_result(output: str) -> str:
    """The observation a tool's output becomes."""
    return f"{RESULT_OPEN}{output}{RESULT_CLOSE}"


def format_error(message: str) -> str:
    """The observation a failed call becomes."""
    return f"{ERROR_OPEN}{message}{ERROR_CLOSE}"


def enclosed(text: str, open_tag: str, close_tag: str) -> str | ParsedCall:
    """The text between the one ``open_tag`` ... ``close_tag`` pair of a turn, or the turn's outcome when it
    has no such single pair: ``none`` (no call), or ``malformed`` saying what is wrong."""
    opens, closes = text.count(open_tag), text.count(close_tag)
    if opens == 0:
        if closes:
            return ParsedCall("malformed", error=f"{close_tag} without {open_tag}")
        return ParsedCall("none")
    if opens > 1:
        return ParsedCall("malformed", error=f"{opens} calls in one turn; make one call per turn")
    start = text.index(open_tag) + len(open_tag)
    end = text.find(close_tag, start)
    if end < 0:
        return ParsedCall("malformed", error=f"{open_tag} without {close_tag}")
    if closes > 1 or text.find(close_tag) < start:
        return ParsedCall("malformed", error=f"{close_tag} without {open_tag}")
    return text[start:end]


def parse_call(text: str) -> ParsedCall:
    """The one outcome of ``text`` under the format above."""
    body = enclosed(text, CALL_OPEN, CALL_CLOSE)
    if isinstance(body, ParsedCall):
        return body
    name, colon, argument = body.partition(":")
    name, argument = name.strip(), argument.strip()
    if not colon:
        return ParsedCall("malformed", error="a call is <tool>NAME: ARGUMENT</tool>; no ':' found")
    if not _NAME.fullmatch(name):
        return ParsedCall("malformed", error=f"tool name {name[:40]!r} is not a name (a-z, 0-9, _)")
    if not argument:
        return ParsedCall("malformed", error=f"empty argument for tool {name!r}")
    return ParsedCall("call", name=name, argument=argument)
