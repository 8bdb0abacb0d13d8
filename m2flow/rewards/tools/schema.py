"""A tool as a function schema (the JSON-schema form chat templates and instruct models read), and the
arguments of a schema-form call turned into the tool's argument text.

A tool may declare ``parameters``, a JSON schema of an object (``{"type": "object", "properties": ...,
"required": [...]}``); one that does not takes one string, ``argument``. A call's ``arguments`` object is
checked against the schema's top level only (an object, the required keys present, no other keys, strings
where the schema says string): what a model gets wrong in practice, without a JSON-schema validator. A
tool still takes one argument text: the value of its one parameter, or, for a tool with several, the
arguments object as JSON text.
"""

from __future__ import annotations

import json
from typing import Any

from m2flow.rewards.tools.base import Tool

DEFAULT_PARAMETER = "argument"
"""The one parameter of a tool that declares no schema of its own."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,),
    "array": (list,),
}


class ArgumentError(ValueError):
    """A call's arguments do not fit the tool's schema (the message says how)."""


def parameters_of(tool: Tool) -> dict[str, Any]:
    """The JSON schema of the tool's arguments: its declared ``parameters``, else one string ``argument``."""
    declared = getattr(tool, "parameters", None)
    if declared is not None:
        if not isinstance(declared, dict) or declared.get("type") != "object" or \
                not isinstance(declared.get("properties"), dict) or not declared["properties"]:
            raise ValueError(f"tool {tool.name!r}: parameters must be a JSON schema of an object with properties")
        return declared
    return {"type": "object", "properties": {DEFAULT_PARAMETER: {"type": "string", "description": tool.description}},
            "required": [DEFAULT_PARAMETER]}


def function_schema(tool: Tool) -> dict[str, Any]:
    """The tool as a function for a chat template's ``tools=``:
    ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": parameters_of(tool)}}


def argument_from(tool: Tool, arguments: Any) -> str:
    """The tool's argument text from a call's ``arguments``; raises ``ArgumentError`` saying what is wrong."""
    schema = parameters_of(tool)
    if not isinstance(arguments, dict):
        raise ArgumentError(f"arguments of {tool.name!r} must be a JSON object, not {type(arguments).__name__}")
    properties: dict[str, Any] = schema["properties"]
    # A misspelt name first: "has no argument 'expr'; its arguments: expression" says more than "missing".
    extra = sorted(set(arguments) - set(properties))
    if extra:
        raise ArgumentError(f"{tool.name!r} has no argument {', '.join(repr(k) for k in extra)}; "
                            f"its arguments: {', '.join(properties)}")
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        raise ArgumentError(f"{tool.name!r} is missing argument {', '.join(repr(k) for k in missing)}")
    for key, value in arguments.items():
        kind = properties[key].get("type") if isinstance(properties[key], dict) else None
        expected = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
        # bool is an int in Python, not in JSON: true is no integer.
        if expected is not None and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
            raise ArgumentError(f"argument {key!r} of {tool.name!r} must be a {kind}, not {type(value).__name__}")
    if len(properties) == 1:
        (value,) = arguments.values() if arguments else ("",)
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(arguments)
