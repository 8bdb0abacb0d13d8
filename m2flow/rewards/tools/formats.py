"""Tool-call formats by name: how a model's turn holds a call, and how a tool's reply is written back.

- ``tag``: the project's compact ``<tool>NAME: ARGUMENT</tool>`` (``calls.py``), replies as
  ``<result>...</result>`` / ``<error>...</error>`` in the text itself. The default, for tiny models.
- ``hermes``: the function-call form of Hermes- and Qwen-style chat templates::

      <tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>

  The reply is the bare output (or ``error: MESSAGE``); the rollout renders it as the template's
  tool-role message (``workers/agentic/chat.py``), so the format adds no markup of its own.

Every text gets exactly one outcome (``ParsedCall.status``), as in ``calls.py``. For ``hermes`` a turn is
``malformed`` when it has an opening tag without its closing one (or the reverse), two calls, a body that is
not JSON, not an object, without a string ``name`` or without an ``arguments`` object (a JSON string that
holds an object is accepted, as some models write it). Whether the arguments fit the tool's schema is the
``ToolBox``'s check (``schema.argument_from``), which knows the tool.
"""

from __future__ import annotations

import json
from typing import Protocol

from m2flow.algorithms.registry import Registry
from m2flow.rewards.tools.calls import CALL_STOP, ParsedCall, enclosed, format_error, format_result, parse_call

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


class CallFormat(Protocol):
    """One way of writing tool calls and their replies."""

    name: str
    stop: tuple[str, ...]
    """Stop strings a model turn is generated with by default (the end of a call)."""
    chat: bool
    """Whether episodes are rendered with the tokenizer's chat template (replies as tool-role messages)."""

    def parse(self, text: str) -> ParsedCall:
        """The one outcome of a model turn's text."""
        ...

    def result(self, output: str) -> str:
        """The observation a tool's output becomes."""
        ...

    def error(self, message: str) -> str:
        """The observation a failed call becomes."""
        ...


class TagFormat:
    """``<tool>NAME: ARGUMENT</tool>``, replies in ``<result>`` / ``<error>`` tags (``calls.py``)."""

    name = "tag"
    stop = (CALL_STOP,)
    chat = False

    def parse(self, text: str) -> ParsedCall:
        return parse_call(text)

    def result(self, output: str) -> str:
        return format_result(output)

    def error(self, message: str) -> str:
        return format_error(message)


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; replies bare, for a tool-role message."""

    name = "hermes"
    stop = (HERMES_CLOSE,)
    chat = True

    def parse(self, text: str) -> ParsedCall:
        body = enclosed(text, HERMES_OPEN, HERMES_CLOSE)
        if isinstance(body, ParsedCall):
            return body
        body = body.strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            return ParsedCall("malformed", error=f"the call is not JSON ({e.msg} at character {e.pos})")
        if not isinstance(call, dict):
            return ParsedCall("malformed", error='a call is a JSON object {"name": ..., "arguments": {...}}')
        name = call.get("name")
        if not isinstance(name, str) or not name:
            return ParsedCall("malformed", error='the call has no "name" string')
        if "arguments" not in call:
            return ParsedCall("malformed", name=name, error=f'the call of {name!r} has no "arguments"')
        arguments = call["arguments"]
        if isinstance(arguments, str):  # arguments written as JSON text
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            return ParsedCall("malformed", name=name, error=f'"arguments" of {name!r} must be a JSON object')
        return ParsedCall("call", name=name, arguments=arguments)

    def result(self, output: str) -> str:
        return output

    def error(self, message: str) -> str:
        return f"error: {message}"


CALL_FORMATS: Registry[CallFormat] = Registry("tool format")
"""Format name -> the format (``rollout.tool_format``); duplicates raise, unknown names list the valid ones."""
CALL_FORMATS.add("tag", TagFormat())
CALL_FORMATS.add("hermes", HermesFormat())
