"""Registry of workflows that ``m2flow train`` can run, keyed by the YAML's top-level ``workflow:``.

A workflow registers one ``Workflow`` object (``driver/workflow.py``). The workflow named ``X`` is
looked up in the registry and, failing that, by importing ``m2flow.workflows.X.workflow`` (a package
of ``m2flow/workflows`` whose ``workflow`` module registers it on import), so no central list has to
be edited and nothing heavy is imported until a workflow is used. A workflow defined elsewhere (a
plug-in, a test) calls ``register_workflow`` itself.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from m2flow.config.convert import from_dict
from m2flow.config.errors import ConfigError
from m2flow.config.loader import WORKFLOW_KEY, compose, parse_override
from m2flow.config.schema import field_types, is_schema
from m2flow.config.yaml_io import read_yaml
from m2flow.driver.workflow import Workflow

logger = logging.getLogger(__name__)

WORKFLOWS_PACKAGE = "m2flow.workflows"
WORKFLOW_MODULE = "workflow"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

_WORKFLOWS: dict[str, Workflow] = {}


def register_workflow(workflow: Workflow) -> Workflow:
    """Register ``workflow`` under its ``name``; a duplicate name or a bad declaration raises."""
    name = getattr(workflow, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"workflow name {name!r} must be lower_snake_case")
    if not is_schema(getattr(workflow, "schema", None)):
        raise TypeError(f"workflow {name!r}: schema must be a dataclass type, got {getattr(workflow, 'schema', None)!r}")
    graph = getattr(workflow, "graph", None)
    if graph is None or graph.name != name:
        raise ValueError(f"workflow {name!r}: its graph must be a WorkflowGraph named {name!r}")
    if name in _WORKFLOWS:
        raise ValueError(f"workflow {name!r} is already registered ({type(_WORKFLOWS[name]).__qualname__})")
    _WORKFLOWS[name] = workflow
    return workflow


def unregister_workflow(name: str) -> None:
    """Remove a registered workflow (for tests and plug-ins that replace one); unknown names raise KeyError."""
    del _WORKFLOWS[name]


def _packaged() -> list[str]:
    """Names of the workflow packages in m2flow/workflows, read from disk so nothing is imported."""
    root = Path(__file__).resolve().parents[1] / "workflows"
    return sorted(p.parent.name for p in root.glob(f"*/{WORKFLOW_MODULE}.py") if not p.parent.name.startswith("_"))


def available_workflows() -> list[str]:
    """Every workflow name that can be run: registered ones plus those the workflow packages register."""
    for name in _packaged():
        try:
            importlib.import_module(f"{WORKFLOWS_PACKAGE}.{name}.{WORKFLOW_MODULE}")
        except Exception as error:  # noqa: BLE001 - a broken workflow must not hide the others
            logger.warning("could not import the workflow %s: %s", name, error)
    return sorted(_WORKFLOWS)


def get_workflow(name: Any) -> Workflow:
    """The workflow registered as ``name`` (importing its package if needed); unknown names raise ConfigError."""
    if not isinstance(name, str) or not name:
        raise ConfigError(WORKFLOW_KEY, f"expected a workflow name, got {name!r}")
    if name not in _WORKFLOWS and _NAME.match(name) and name in _packaged():
        importlib.import_module(f"{WORKFLOWS_PACKAGE}.{name}.{WORKFLOW_MODULE}")  # registers on import
    if name not in _WORKFLOWS:
        known = ", ".join(available_workflows()) or "(none)"
        raise ConfigError(WORKFLOW_KEY, f"unknown workflow {name!r}; registered workflows: {known}")
    return _WORKFLOWS[name]


def _workflow_name(path: str | Path | None, overrides: Sequence[str]) -> Any:
    for text in reversed(overrides):  # the last override wins, as when merging
        if text.partition("=")[0].strip() != WORKFLOW_KEY:
            continue  # typed later against the schema (a placement's text is no YAML)
        key, value = parse_override(text)
        return value
    # Only the one key is read here; the whole file is composed once the schema is known.
    data = read_yaml(path) if path is not None else {}
    if not isinstance(data, dict) or WORKFLOW_KEY not in data:
        where = f"{path}" if path is not None else "the config"
        known = ", ".join(available_workflows()) or "(none)"
        raise ConfigError(
            WORKFLOW_KEY,
            f"{where} has no top-level 'workflow:' key; registered workflows: {known}",
        )
    return data[WORKFLOW_KEY]


def load_workflow_config(
    path: str | Path | None, overrides: Sequence[str] = ()
) -> tuple[Workflow, Any]:
    """The workflow named by the file's ``workflow:`` key (or a ``workflow=`` override) and its validated config."""
    spec = get_workflow(_workflow_name(path, overrides))
    rest = [o for o in overrides if o.partition("=")[0].strip() != WORKFLOW_KEY]
    data = compose(path, rest, spec.schema)
    if WORKFLOW_KEY in field_types(spec.schema):
        data[WORKFLOW_KEY] = spec.name
    else:
        data.pop(WORKFLOW_KEY, None)
    cfg = from_dict(spec.schema, data)
    check_placement_of(spec, cfg)
    return spec, cfg


def check_placement_of(workflow: Workflow, cfg: Any) -> None:
    """Fail before anything starts when the config's placement cannot be met on its cluster (``auto`` and a
    ``plan_file`` are checked when planned); a ConfigError names the key."""
    from m2flow.driver.run_config import is_auto
    from m2flow.runtime.cluster import check_placement
    from m2flow.runtime.placement import PlacementError

    placement = getattr(cfg, "placement", None)
    if not isinstance(placement, str) or is_auto(placement) or getattr(cfg, "plan_file", None):
        return
    try:
        check_placement(placement, cfg.cluster, workflow.graph.component_names)
    except PlacementError as e:
        raise ConfigError("placement", str(e)) from None
