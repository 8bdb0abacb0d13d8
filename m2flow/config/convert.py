"""Strict conversion between plain data (dicts, lists, scalars) and typed config dataclasses.

Rules (see docs/user_guide.md, "Configuration"): unknown keys, wrong types and missing required
fields fail with a ConfigError naming the dotted key. An int is accepted for a float field, and a
float with an exact integer value (``1e6``) for an int field; nothing else is coerced: ``"3"`` is
not an int, ``2024`` is not a str, and only ``true``/``false`` are booleans.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from m2flow.config.errors import ConfigError, join_key
from m2flow.config.schema import field_types, is_schema, is_union, schema_fields, type_name

T = TypeVar("T")


def from_dict(schema: type[T], data: Mapping[str, Any] | None, *, path: str = "") -> T:
    """Build and validate a ``schema`` instance from plain data; every problem raises ConfigError."""
    if not is_schema(schema):
        raise TypeError(f"from_dict needs a dataclass type, got {schema!r}")
    return _convert(schema, {} if data is None else data, path)


def to_dict(cfg: Any) -> Any:
    """Plain data for a config (dicts, lists, scalars): paths become str, enums their value."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in schema_fields(type(cfg))}
    if isinstance(cfg, Mapping):
        return {to_dict(k): to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, enum.Enum):
        return cfg.value if isinstance(cfg.value, (str, int, float, bool)) else cfg.name
    if isinstance(cfg, Path):
        return str(cfg)
    return cfg


def with_overrides(schema: type[T], cfg: T, changes: Mapping[str, Any]) -> T:
    """A validated copy of ``cfg`` with dotted ``changes`` applied (``{"rollout.prompts_per_chunk": 2}``)."""
    return from_dict(schema, set_dotted(to_dict(cfg), changes))


def set_dotted(data: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a config's plain dict, changed in place and returned) with dotted ``changes`` set."""
    for key, value in changes.items():
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return data


def validate_tree(cfg: Any, *, path: str = "") -> None:
    """Run ``validate()`` on every dataclass in ``cfg``, innermost first; failures raise ConfigError."""
    if isinstance(cfg, Mapping):
        for key, value in cfg.items():
            validate_tree(value, path=join_key(path, str(key)))
    elif isinstance(cfg, (list, tuple)):
        for index, value in enumerate(cfg):
            validate_tree(value, path=join_key(path, index))
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        for f in schema_fields(type(cfg)):
            validate_tree(getattr(cfg, f.name), path=join_key(path, f.name))
        _run_validate(cfg, path)


def _run_validate(cfg: Any, path: str) -> None:
    validate = getattr(cfg, "validate", None)
    if not callable(validate):
        return
    try:
        validate()
    except ValueError as error:  # ConfigError included
        raise _prefixed(type(cfg), path, error) from None


# "num_cpus: must be >= 1", "num_cpus must be >= 1", "stages[0].envs: too many"
_LEADING_KEY = re.compile(r"([A-Za-z_]\w*)((?:\.\w+|\[\d+\])*)(?::\s*|\s+)(.+)", re.DOTALL)


def _prefixed(schema: type, path: str, error: Exception) -> ConfigError:
    """A validate()/__post_init__ failure as a ConfigError under the dotted path of its config.

    A message that starts with one of the config's field names is attributed to that field:
    ``num_cpus must be >= 1`` raised by the ``cluster`` section becomes ``cluster.num_cpus: must be >= 1``.
    """
    if isinstance(error, ConfigError):
        key, reason = error.key, error.reason
    else:
        message = str(error)
        match = _LEADING_KEY.fullmatch(message)
        names = {f.name for f in dataclasses.fields(schema)}
        if match and match.group(1) in names:
            key, reason = match.group(1) + match.group(2), match.group(3)
        else:
            key, reason = "", message
    if not path:
        return ConfigError(key, reason)
    return ConfigError(join_key(path, key) if key else path, reason)


def _got(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _convert(tp: Any, value: Any, path: str) -> Any:
    if tp is Any or tp is object:
        return value
    if is_schema(tp):
        return _convert_schema(tp, value, path)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        for allowed in args:
            # type check too: Literal[1] must not accept True
            if value == allowed and type(value) is type(allowed):
                return allowed
        choices = ", ".join(repr(a) for a in args)
        raise ConfigError(path, f"{value!r} is not one of {choices}")
    if is_union(tp):
        return _convert_union(tp, args, value, path)
    if tp is type(None) or tp is None:
        if value is None:
            return None
        raise ConfigError(path, f"expected null, got {_got(value)}")
    if value is None:
        raise ConfigError(path, f"expected {type_name(tp)}, got null")
    if origin in (list, tuple) or tp in (list, tuple):
        return _convert_sequence(tp, origin or tp, args, value, path)
    if origin is dict or tp is dict:
        return _convert_dict(tp, args, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _convert_enum(tp, value, path)
    return _convert_scalar(tp, value, path)


def _convert_scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected bool (true or false), got {_got(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)  # 1e6 is a natural way to write an integer count
        raise ConfigError(path, f"expected int, got {_got(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, f"expected float, got {_got(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        hint = "; quote it in YAML" if isinstance(value, (int, float, bool)) else ""
        raise ConfigError(path, f"expected str, got {_got(value)}{hint}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(path, f"expected a path (str), got {_got(value)}")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(path, f"expected {type_name(tp)}, got {_got(value)}")
    raise TypeError(f"{path or 'config'}: unsupported field type {tp!r}")


def _convert_union(tp: Any, args: tuple, value: Any, path: str) -> Any:
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(path, f"expected {type_name(tp)}, got null")
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return _convert(options[0], value, path)
    for option_type in options:  # first alternative that accepts the value wins
        try:
            return _convert(option_type, value, path)
        except ConfigError:
            continue
    raise ConfigError(path, f"expected {type_name(tp)}, got {_got(value)}")


def _convert_sequence(tp: Any, origin: Any, args: tuple, value: Any, path: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(path, f"expected a list ({type_name(tp)}), got {_got(value)}")
    if origin is list:
        item = args[0] if args else Any
        return [_convert(item, v, join_key(path, i)) for i, v in enumerate(value)]
    if not args:
        return tuple(value)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(args[0], v, join_key(path, i)) for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(path, f"expected {len(args)} items ({type_name(tp)}), got {len(value)}")
    return tuple(_convert(a, v, join_key(path, i)) for i, (a, v) in enumerate(zip(args, value)))


def _convert_dict(tp: Any, args: tuple, value: Any, path: str) -> dict:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected a mapping ({type_name(tp)}), got {_got(value)}")
    key_type, value_type = args if args else (Any, Any)
    out = {}
    for k, v in value.items():
        try:
            key = _convert(key_type, k, path)
        except ConfigError as error:
            raise ConfigError(path, f"bad key {k!r}: {error.reason}") from None
        out[key] = _convert(value_type, v, join_key(path, str(k)))
    return out


def _convert_enum(tp: type[enum.Enum], value: Any, path: str) -> enum.Enum:
    if isinstance(value, tp):
        return value
    for member in tp:
        if value == member.value and type(value) is type(member.value):
            return member
    if isinstance(value, str) and value in tp.__members__:
        return tp[value]
    choices = ", ".join(repr(m.value) for m in tp)
    raise ConfigError(path, f"{value!r} is not one of {choices}")


def _convert_schema(schema: type, value: Any, path: str) -> Any:
    if isinstance(value, schema):
        validate_tree(value, path=path)
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            path, f"expected a mapping of {schema.__name__} fields, got {_got(value)}"
        )
    types_ = field_types(schema)
    for key in value:
        if key not in types_:
            raise ConfigError(join_key(path, str(key)), _unknown_key_reason(key, list(types_)))
    kwargs = {}
    for f in schema_fields(schema):
        key = join_key(path, f.name)
        if f.name in value:
            kwargs[f.name] = _convert(types_[f.name], value[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if is_schema(types_[f.name]):
                # A section without a default: build it from nothing, so the error (if any)
                # names the innermost field that is really missing.
                kwargs[f.name] = _convert(types_[f.name], {}, key)
                continue
            raise ConfigError(key, f"missing required field ({type_name(types_[f.name])})")
    try:
        cfg = schema(**kwargs)
    except (ValueError, TypeError) as error:  # a check in __post_init__
        raise _prefixed(schema, path, error) from None
    for f in schema_fields(schema):
        if f.name not in kwargs:  # defaulted sections are validated like given ones
            validate_tree(getattr(cfg, f.name), path=join_key(path, f.name))
    _run_validate(cfg, path)
    return cfg


def _unknown_key_reason(key: Any, allowed: list[str]) -> str:
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    listing = ", ".join(allowed) if allowed else "(none)"
    return f"unknown key; {hint}allowed keys: {listing}"
