"""Typed, validated configuration: dataclass schemas, YAML + override loading, workflow registry.

Define a component's config as a ``@dataclass`` whose fields use :func:`option` (default + one-line
doc); optionally add ``validate(self) -> None`` raising ``ValueError`` for impossible values. Load
with :func:`load_config`; every problem surfaces as :class:`ConfigError` naming the dotted key.
"""

from m2flow.config.convert import from_dict, to_dict, validate_tree
from m2flow.config.errors import ConfigError
from m2flow.config.loader import compose, load_config, parse_override, save_config, to_yaml
from m2flow.config.schema import FieldInfo, describe, option, type_name, undocumented
from m2flow.config.workflows import (
    WorkflowSpec,
    available_workflows,
    get_workflow,
    load_workflow_config,
    register_workflow,
    unregister_workflow,
)

__all__ = [
    "ConfigError",
    "FieldInfo",
    "WorkflowSpec",
    "available_workflows",
    "compose",
    "describe",
    "from_dict",
    "get_workflow",
    "load_config",
    "load_workflow_config",
    "option",
    "parse_override",
    "register_workflow",
    "save_config",
    "to_dict",
    "to_yaml",
    "type_name",
    "undocumented",
    "unregister_workflow",
    "validate_tree",
]
