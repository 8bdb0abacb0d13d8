"""Registry of workflows that ``m2flow train`` can run, keyed by the YAML's top-level ``workflow:``.

A workflow registers its top-level config dataclass and a ``run(cfg) -> int`` function. The
workflow named ``X`` is looked up in the registry and, failing that, by importing the module
``m2flow.workflows.X`` (which registers it on import), so no central list has to be edited and
nothing heavy is imported until a workflow is actually used. It lives above ``config/``: config only
loads and validates, and knows no workflow.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.config.errors import ConfigError
from m2flow.config.convert import from_dict
from m2flow.config.loader import WORKFLOW_KEY, compose, parse_override
from m2flow.config.schema import field_types, is_schema
from m2flow.config.yaml_io import read_yaml

logger = logging.getLogger(__name__)

RUNNERS_PACKAGE = "m2flow.workflows"
_NOT_WORKFLOWS = {"registry", "run", "stop", "plan_command", "plan_search", "plan_context", "auto", "auto_choice", "auto_config",
                  "profiler", "profile_command", "replan"}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class WorkflowSpec:
    """A runnable workflow: its name, top-level config schema and entry function."""

    name: str
    schema: type
    run: Callable[[Any], int]
    help: str = ""
    plan: Callable[[Any, Any], Any] | None = None
    """``plan(cfg, layout) -> Plan``: how a config of this workflow runs on a cluster of ``layout``"""
    graph: Any = None
    """the workflow's ``WorkflowGraph`` (components and edges), when it declares one"""
    search: Callable[[Any, Any], Any] | None = None
    """``search(cfg, plan) -> planner.search.SearchSpace``: what ``m2flow plan search`` may vary"""
    auto: Any = None
    """``auto_config.AutoSupport``: what ``m2flow profile`` and ``placement: auto`` need of the workflow"""


_WORKFLOWS: dict[str, WorkflowSpec] = {}


def register_workflow(
    name: str, schema: type, run_fn: Callable[[Any], int], *, help: str = "",
    plan: Callable[[Any, Any], Any] | None = None, graph: Any = None, search: Callable[[Any, Any], Any] | None = None,
    auto: Any = None,
) -> WorkflowSpec:
    """Register ``run_fn(cfg) -> int`` under ``name`` with config dataclass ``schema``; duplicates raise."""
    if not _NAME.match(name):
        raise ValueError(f"workflow name {name!r} must be lower_snake_case")
    if not is_schema(schema):
        raise TypeError(f"workflow {name!r}: schema must be a dataclass type, got {schema!r}")
    if name in _WORKFLOWS:
        raise ValueError(f"workflow {name!r} is already registered ({_WORKFLOWS[name].schema!r})")
    doc = (schema.__doc__ or "").strip().splitlines()
    spec = WorkflowSpec(name, schema, run_fn, help or (doc[0] if doc else ""), plan, graph, search, auto)
    _WORKFLOWS[name] = spec
    return spec


def unregister_workflow(name: str) -> None:
    """Remove a registered workflow (for tests and plug-ins that replace one); unknown names raise KeyError."""
    del _WORKFLOWS[name]


def _runner_modules() -> list[str]:
    """Names of the modules in m2flow/workflows, read from disk so nothing is imported."""
    package = Path(__file__).resolve().parent
    return sorted(p.stem for p in package.glob("*.py") if not p.stem.startswith("_") and p.stem not in _NOT_WORKFLOWS)


def available_workflows() -> list[str]:
    """Every workflow name that can be run: registered ones plus those the runner modules register."""
    for module in _runner_modules():
        try:
            importlib.import_module(f"{RUNNERS_PACKAGE}.{module}")
        except Exception as error:  # noqa: BLE001 - a broken runner must not hide the others
            logger.warning("could not import %s.%s: %s", RUNNERS_PACKAGE, module, error)
    return sorted(_WORKFLOWS)


def get_workflow(name: Any) -> WorkflowSpec:
    """The workflow registered as ``name`` (importing its runner module if needed); unknown names raise ConfigError."""
    if not isinstance(name, str) or not name:
        raise ConfigError(WORKFLOW_KEY, f"expected a workflow name, got {name!r}")
    if name not in _WORKFLOWS and _NAME.match(name) and name in _runner_modules():
        importlib.import_module(f"{RUNNERS_PACKAGE}.{name}")  # registers on import
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
) -> tuple[WorkflowSpec, Any]:
    """The workflow named by the file's ``workflow:`` key (or a ``workflow=`` override) and its validated config."""
    spec = get_workflow(_workflow_name(path, overrides))
    rest = [o for o in overrides if o.partition("=")[0].strip() != WORKFLOW_KEY]
    data = compose(path, rest, spec.schema)
    if WORKFLOW_KEY in field_types(spec.schema):
        data[WORKFLOW_KEY] = spec.name
    else:
        data.pop(WORKFLOW_KEY, None)
    return spec, from_dict(spec.schema, data)
