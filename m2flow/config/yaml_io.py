"""Reading and writing YAML with the YAML 1.2 core rules for plain scalars.

PyYAML follows YAML 1.1, where ``yes``/``no``/``on``/``off`` are booleans, ``010`` is octal 8,
``1e-3`` is a string and ``2024-01-01`` is a date. Config files are easier to reason about with the
1.2 rules: only ``true``/``false`` are booleans, ``010`` is the integer 10, ``1e-3`` is a float and
dates stay strings. Two conveniences on top: ``1_000_000`` is an integer, and a key written twice
in one mapping is an error instead of silently keeping the last value.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from m2flow.config.errors import ConfigError

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+(?:_[0-9]+)*|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_RESOLVERS = [
    ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
    ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
    ("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789.")),
]


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalar rules and duplicate-key detection."""


# Replace (not extend) the 1.1 resolvers; keep the merge key so `<<: *anchor` still works.
_Loader.yaml_implicit_resolvers = {}
_Loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
for _tag, _regexp, _first in _RESOLVERS:
    _Loader.add_implicit_resolver(_tag, _regexp, _first)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    if text.startswith("0x"):
        return int(text[2:], 16)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 10)  # base 10 explicitly: a leading zero is not octal


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let PyYAML report it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.construct_mapping = _construct_mapping  # type: ignore[method-assign]


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string either YAML 1.1 or our 1.2 rules would re-type."""


for _tag, _regexp, _first in _RESOLVERS:
    _Dumper.add_implicit_resolver(_tag, _regexp, _first)


def _describe_yaml_error(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        problem = error.problem or "syntax error"
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(error).replace("\n", " ")


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text with the 1.2 core scalar rules; a syntax error raises ConfigError."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as error:
        raise ConfigError("", f"{source}: invalid YAML: {_describe_yaml_error(error)}") from None


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file; a missing or unreadable file raises ConfigError naming the path."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError("", f"config path is a directory, not a file: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError("", f"cannot read config file {path}: {error}") from None
    return parse_yaml(text, source=str(path))


def dump_yaml(data: Any) -> str:
    """Block-style YAML for plain data (dicts keep their order) that parse_yaml reads back equal."""
    return yaml.dump(
        data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def dump_inline(data: Any) -> str:
    """One-line flow-style YAML for a plain value, e.g. ``[1, 2]`` or ``null``."""
    text = yaml.dump(data, Dumper=_Dumper, default_flow_style=True, width=10**6, allow_unicode=True)
    text = text.strip()
    # A bare scalar document is followed by an explicit end marker; it is noise on one line.
    return text[: -len("\n...")] if text.endswith("\n...") else text
