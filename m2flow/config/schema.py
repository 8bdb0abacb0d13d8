"""Reading config schemas: field docs, resolved field types, readable type names, field listings.

Convention: a config is a plain ``@dataclass``; every field is declared with :func:`option`, which
stores its one-line doc in ``field.metadata["doc"]`` where :func:`describe` (and so
``m2flow config docs``) finds it. The dataclass defaults are the only source of defaults.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from m2flow.config.errors import ConfigError, join_key

DOC_KEY = "doc"
MISSING = dataclasses.MISSING


def option(
    default: Any = MISSING,
    doc: str | None = None,
    *,
    default_factory: Any = MISSING,
    **field_kwargs: Any,
) -> Any:
    """A dataclass field with a one-line ``doc``; mutable defaults (lists, dicts, configs) are copied per instance."""
    if not doc or not isinstance(doc, str):
        raise TypeError("option() needs a one-line doc string: option(default, 'what it is')")
    metadata = {**field_kwargs.pop("metadata", {}), DOC_KEY: doc}
    if default is not MISSING and default_factory is not MISSING:
        raise TypeError("option() takes a default or a default_factory, not both")
    if default is not MISSING and _needs_factory(default):
        # dataclasses refuse unhashable defaults; a deep copy per instance keeps instances independent.
        default_factory = functools.partial(copy.deepcopy, default)
        default = MISSING
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata=metadata, **field_kwargs
    )


def _needs_factory(value: Any) -> bool:
    if isinstance(value, (list, dict, set)):
        return True
    return dataclasses.is_dataclass(value) and getattr(type(value), "__hash__", None) is None


def is_schema(tp: Any) -> bool:
    """True for a dataclass type (a config section)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


@functools.lru_cache(maxsize=None)
def field_types(schema: type) -> dict[str, Any]:
    """Resolved types of the init fields of ``schema``, in declaration order (string annotations resolved)."""
    try:
        hints = typing.get_type_hints(schema)
    except (NameError, TypeError) as error:
        raise TypeError(f"cannot resolve the field types of {schema.__qualname__}: {error}") from error
    return {f.name: _strip_annotated(hints[f.name]) for f in dataclasses.fields(schema) if f.init}


def schema_fields(schema: type) -> list[dataclasses.Field]:
    """The init fields of ``schema`` (the keys a config mapping may hold)."""
    return [f for f in dataclasses.fields(schema) if f.init]


def field_doc(f: dataclasses.Field) -> str:
    """The one-line doc of a field, or "" if it has none."""
    return str(f.metadata.get(DOC_KEY, ""))


def has_default(f: dataclasses.Field) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def default_of(f: dataclasses.Field) -> Any:
    """The default value of a field (a fresh one for factories); MISSING for required fields."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _strip_annotated(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Annotated:
        return typing.get_args(tp)[0]
    return tp


def is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def type_name(tp: Any) -> str:
    """A short readable name: ``int``, ``str | None``, ``'a' | 'b'``, ``list[float]``, ``ClusterConfig``."""
    tp = _strip_annotated(tp)
    if tp is type(None) or tp is None:
        return "None"
    if tp is Any:
        return "any"
    if tp is Path:
        return "path"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if is_union(tp):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, tuple, dict):
        if not args:
            return origin.__name__
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """One documented entry of a schema, as listed by ``m2flow config docs``."""

    key: str  # dotted path, e.g. "cluster.address"
    type: str  # readable type name
    default: Any  # MISSING when the field is required
    doc: str
    section: bool  # True for a nested config (its fields follow it)


def describe(schema: type, prefix: str = "", defaults: Any = None) -> list[FieldInfo]:
    """Every field of ``schema``, depth first, nested sections followed by their own fields.

    ``defaults`` is the section's default instance when the parent sets one (``default_factory``
    returning a customised section), so the listed defaults are the ones a run really gets.
    """
    out: list[FieldInfo] = []
    types_ = field_types(schema)
    for f in schema_fields(schema):
        key = join_key(prefix, f.name)
        tp = types_[f.name]
        section = is_schema(tp)
        default = getattr(defaults, f.name) if defaults is not None else default_of(f)
        out.append(FieldInfo(key, type_name(tp), default, field_doc(f), section))
        if section:
            out.extend(describe(tp, key, default if dataclasses.is_dataclass(default) else None))
    return out


def undocumented(schema: type) -> list[str]:
    """Dotted keys of fields (nested included) that have no doc; a test can assert this is empty."""
    return [info.key for info in describe(schema) if not info.doc]


def target_type(schema: type, key: str) -> Any:
    """The declared type at dotted ``key`` (``a.b.0.c``), or None when the schema cannot say (unknown key, Any).

    Raises ConfigError when ``key`` descends into a plain value, e.g. ``lr.x`` where ``lr`` is a float.
    """
    tp: Any = schema
    walked = ""
    for part in key.split("."):
        tp = _non_none(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if is_schema(tp):
            tp = field_types(tp).get(part)
        elif origin is list:
            tp = args[0] if args else None
        elif origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                tp = args[0]
            elif part.isdigit() and int(part) < len(args):
                tp = args[int(part)]
            else:
                tp = None
        elif origin is dict:
            tp = args[1] if args else None
        elif tp is None or tp is Any or tp in (list, dict, tuple) or is_union(tp):
            return None
        else:
            raise ConfigError(
                key, f"'{walked}' holds a value of type {type_name(tp)}; it has no sub-keys"
            )
        if tp is None:
            return None
        walked = join_key(walked, part)
    return tp


def _non_none(tp: Any) -> Any:
    """``X`` for ``X | None``; other types unchanged."""
    if is_union(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def is_text_type(tp: Any) -> bool:
    """True when every non-None alternative of ``tp`` is written as text (str, path, str enum or literal)."""
    if is_union(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return bool(rest) and all(is_text_type(a) for a in rest)
    if tp is str or tp is Path:
        return True
    if typing.get_origin(tp) is Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return all(isinstance(m.value, str) for m in tp)
    return False


def allows_none(tp: Any) -> bool:
    """True when ``None`` is a valid value for ``tp``."""
    if tp is Any or tp is None or tp is type(None):
        return True
    if is_union(tp):
        return any(a is type(None) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return None in typing.get_args(tp)
    return False


def get_key(cfg: Any, key: str) -> Any:
    """The value at dotted ``key`` of a config object (``rollout.num_threads``); an unknown key raises KeyError."""
    node = cfg
    for part in key.split("."):
        if not hasattr(node, part):
            raise KeyError(f"{type(cfg).__name__} has no key {key!r}")
        node = getattr(node, part)
    return node
