"""Loading configs: YAML file + ``key.sub=value`` overrides -> interpolation -> typed dataclass.

This is the only place YAML and command-line text become config values; code below it receives
validated dataclasses. ``workflow`` is a reserved top-level key naming the workflow a file is for;
it is dropped here unless the schema declares it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from m2flow.config.convert import from_dict, to_dict
from m2flow.config.errors import ConfigError
from m2flow.config.schema import allows_none, field_types, is_text_type, target_type
from m2flow.config.yaml_io import dump_yaml, parse_yaml, read_yaml

T = TypeVar("T")

WORKFLOW_KEY = "workflow"
_NULL_WORDS = ("null", "Null", "NULL", "~")


def parse_override(text: str, schema: type | None = None) -> tuple[str, Any]:
    """Split ``key.sub=value`` and type the value: YAML rules, except text fields keep the raw text.

    With a schema, ``run.name=2024`` stays the string "2024" and ``model.path=null`` is None only
    when the field is optional; ``lr=1e-3`` is a float and ``devices=[0,1]`` a list either way.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError("", f"bad override {text!r}: expected key=value, e.g. cluster.num_cpus=4")
    tp = target_type(schema, key) if schema is not None else None
    if tp is not None and is_text_type(tp):
        stripped = raw.strip()
        if stripped in _NULL_WORDS and allows_none(tp):
            return key, None
        if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
            return key, parse_yaml(stripped, source=f"override {text!r}")  # explicit quotes
        return key, raw
    return key, parse_yaml(raw, source=f"override {text!r}")


def _first_line(error: OmegaConfBaseException) -> str:
    message = getattr(error, "msg", None) or str(error)
    return str(message).strip().splitlines()[0] if str(message).strip() else type(error).__name__


def compose(
    path: str | Path | None = None, overrides: Sequence[str] = (), schema: type | None = None
) -> dict[str, Any]:
    """Plain data of a YAML file merged with overrides, interpolations (``${...}``) resolved."""
    data: Any = {} if path is None else read_yaml(path)
    source = str(path) if path is not None else "config"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            "", f"{source}: the top level must be a mapping of keys, got {type(data).__name__}"
        )
    try:
        tree = OmegaConf.create(dict(data))
    except OmegaConfBaseException as error:
        raise ConfigError(str(error.full_key or ""), _first_line(error)) from None
    for text in overrides:
        key, value = parse_override(text, schema)
        try:
            OmegaConf.update(tree, key, value, merge=True)
        except OmegaConfBaseException as error:
            raise ConfigError(key, f"cannot apply override {text!r}: {_first_line(error)}") from None
    try:
        resolved = OmegaConf.to_container(tree, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as error:
        raise ConfigError(
            str(error.full_key), "value is ??? (must be set: in the file or as key=value)"
        ) from None
    except OmegaConfBaseException as error:
        raise ConfigError(
            str(error.full_key or ""), f"cannot resolve interpolation: {_first_line(error)}"
        ) from None
    assert isinstance(resolved, dict)
    return resolved


def load_config(
    schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()
) -> T:
    """The validated ``schema`` instance for a YAML file (optional) and ``key=value`` overrides."""
    data = compose(path, overrides, schema)
    if WORKFLOW_KEY not in field_types(schema):
        data.pop(WORKFLOW_KEY, None)
    return from_dict(schema, data)


def _escape_interpolation(value: Any) -> Any:
    """Make resolved strings that contain ``${`` read back literally (OmegaConf's ``\\${`` escape)."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: _escape_interpolation(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape_interpolation(v) for v in value]
    return value


def to_yaml(cfg: Any, workflow: str | None = None) -> str:
    """YAML text of a resolved config that :func:`load_config` reads back equal; ``workflow`` goes first."""
    data = _escape_interpolation(to_dict(cfg))
    if workflow is not None:
        data = {WORKFLOW_KEY: workflow, **data}
    return dump_yaml(data)


def save_config(cfg: Any, path: str | Path, workflow: str | None = None) -> Path:
    """Write :func:`to_yaml` of ``cfg`` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg, workflow), encoding="utf-8")
    return path
