"""Tool-call formats: the hermes form's parsing, the tools' function schemas and the box's answers to each
kind of bad call (an observation and a count, never a raise)."""

from __future__ import annotations

import json

import pytest

from m2flow.algorithms.registry import UnknownNameError
from m2flow.rewards.tools.calculator import Calculator
from m2flow.rewards.tools.formats import CALL_FORMATS
from m2flow.rewards.tools.registry import ToolBox
from m2flow.rewards.tools.schema import ArgumentError, argument_from, function_schema

HERMES = CALL_FORMATS.get("hermes")


def _call(name: str, arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_a_hermes_call_is_parsed_with_text_before_it():
    parsed = HERMES.parse('let me see <tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>')
    assert (parsed.status, parsed.name, parsed.arguments) == ("call", "calculator", {"expression": "2*3"})
    # Arguments written as JSON text, as some models do.
    parsed = HERMES.parse('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert parsed.arguments == {"code": "print(1)"}
    assert HERMES.parse("56088").status == "none" and HERMES.parse("").status == "none"


@pytest.mark.parametrize("text, error", [
    ('<tool_call>{"name": "calculator", "arguments": {}}', "without </tool_call>"),
    ("6</tool_call>", "</tool_call> without <tool_call>"),
    (_call("calculator", {"expression": "1"}) * 2, "2 calls in one turn"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 1+}}</tool_call>', "not JSON"),
    ("<tool_call>[1, 2]</tool_call>", "a JSON object"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
    ('<tool_call>{"name": "calculator"}</tool_call>', 'has no "arguments"'),
    ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
])
def test_malformed_hermes_calls_say_what_is_wrong(text, error):
    parsed = HERMES.parse(text)
    assert parsed.status == "malformed" and error in parsed.error


def test_the_shipped_tools_schemas():
    from m2flow.rewards.tools.python import PythonTool

    assert function_schema(Calculator()) == {"type": "function", "function": {
        "name": "calculator", "description": Calculator.description,
        "parameters": {"type": "object", "required": ["expression"],
                       "properties": {"expression": {"type": "string",
                                                     "description": "an arithmetic expression, e.g. 123*456"}}}}}
    assert PythonTool.parameters == {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "description": "Python source; print what you want to see"}}}
    box = ToolBox.from_names(["calculator"])
    assert box.schemas() == [function_schema(box.tools["calculator"])]


def test_a_tool_without_a_schema_takes_one_string_and_arguments_are_checked():
    class Echo:
        name, description, isolated = "echo", "say it back", False

        def __call__(self, argument: str) -> str:
            return argument

    assert function_schema(Echo())["function"]["parameters"] == {
        "type": "object", "properties": {"argument": {"type": "string", "description": "say it back"}},
        "required": ["argument"]}
    assert argument_from(Echo(), {"argument": "hi"}) == "hi"
    for arguments, error in [({}, "missing argument 'argument'"), ({"argument": "a", "x": 1}, "has no argument 'x'"),
                             ({"argument": 3}, "must be a string, not int"), ("hi", "must be a JSON object")]:
        with pytest.raises(ArgumentError, match=error):
            argument_from(Echo(), arguments)


def test_the_box_answers_hermes_calls_and_every_bad_call_with_an_observation():
    box = ToolBox.from_names(["calculator"], call_format="hermes")
    try:
        assert box.respond(_call("calculator", {"expression": "123*456"})).observation == "56088"
        assert box.respond("56088").outcome == "none"
        replies = {
            "bad_json": box.respond('<tool_call>{"name": "calculator", "arguments": {</tool_call>'),
            "unknown": box.respond(_call("search", {"query": "x"})),
            "missing": box.respond(_call("calculator", {})),
            "wrong_key": box.respond(_call("calculator", {"expr": "1+1"})),
            "raised": box.respond(_call("calculator", {"expression": "import os"})),
        }
        assert replies["bad_json"].outcome == "malformed" and replies["bad_json"].observation.startswith(
            "error: malformed call: the call is not JSON")
        assert replies["unknown"].observation == "error: unknown tool 'search'; tools: calculator"
        assert replies["missing"].observation == "error: malformed call: 'calculator' is missing argument 'expression'"
        assert "has no argument 'expr'; its arguments: expression" in replies["wrong_key"].observation
        assert replies["raised"].outcome == "error" and replies["raised"].observation.startswith("error: calculator failed")
        stats = box.pop_stats()
        assert (stats.turns, stats.ok, stats.malformed, stats.unknown, stats.errors) == (7, 1, 3, 1, 1)
        # The tag format is untouched by the other, and an unknown format lists the valid ones.
        box.use_format("tag")
        assert box.respond("<tool>calculator: 2*3</tool>").observation == "<result>6</result>"
        with pytest.raises(UnknownNameError, match="hermes"):
            box.use_format("json")
    finally:
        box.close()
