"""Typed, validated configuration: dataclass schemas, YAML + override loading. (The workflow registry is ``m2flow.driver.registry``.)

Define a component's config as a ``@dataclass`` whose fields use :func:`option` (default + one-line
doc); optionally add ``validate(self) -> None`` raising ``ValueError`` for impossible values. Load
with :func:`load_config`; every problem surfaces as :class:`ConfigError` naming the dotted key.
"""

from m2flow.config.convert import from_dict, to_dict, validate_tree, with_overrides
from m2flow.config.errors import ConfigError
from m2flow.config.loader import compose, load_config, parse_override, save_config, to_yaml
from m2flow.config.schema import FieldInfo, describe, option, type_name, undocumented

__all__ = [
    "ConfigError",
    "FieldInfo",
    "compose",
    "describe",
    "from_dict",
    "load_config",
    "option",
    "parse_override",
    "save_config",
    "to_dict",
    "to_yaml",
    "type_name",
    "undocumented",
    "validate_tree",
    "with_overrides",
]
