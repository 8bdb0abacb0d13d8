"""The package's import graph, read with `ast`: no module imports itself in a circle, and config imports no workflow.

Every `import` / `from ... import` counts, at module level and inside functions alike (a lazy import
in a circle is still a circle: it only moves the failure to the first call), and so do imports under
`if TYPE_CHECKING:`: a circle of type references still ties two modules into one. `from package
import name` is an edge to the module `package.name` when there is one, else to the package's
`__init__`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "m2flow"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package by its `__init__`)."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in the tree (module level, functions, methods, conditionals)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:  # relative: resolved against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                       for alias in node.names]
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


GRAPH = import_graph()
CYCLES = cycles(GRAPH)


def test_the_cycle_finder_finds_circles_and_only_them():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert cycles(graph) == [["a", "b", "c"], ["e", "f"]]


def test_the_graph_sees_lazy_imports():
    # The lazy import inside a method of the rollout config (the backends' declared traits tell what they accept).
    assert "m2flow.backends.generation.registry" in GRAPH["m2flow.workers.config"]
    assert "m2flow.models.functional_layers" in GRAPH["m2flow.models.functional_decode"]


def test_no_import_cycles():
    assert CYCLES == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in CYCLES)


LEAVES = (f"{PACKAGE}.errors", f"{PACKAGE}.lazy")
"""Modules that import nothing of the package, so any layer may import them."""


def _deps(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in GRAPH.items() if m == prefix or m.startswith(prefix + ".")}


def test_leaves_import_nothing_of_the_package():
    for leaf in (*LEAVES, f"{PACKAGE}.commands"):
        assert {d for d in GRAPH[leaf] if d.startswith(f"{PACKAGE}.")} == set(), leaf


def test_the_runtime_imports_nothing_above_it():
    above = sorted((m, t) for m, deps in GRAPH.items() if m.startswith(f"{PACKAGE}.runtime")
                   for t in deps if t.startswith(f"{PACKAGE}.") and not t.startswith(f"{PACKAGE}.runtime")
                   and t not in LEAVES)
    assert above == []


def test_the_driver_imports_no_workflow_no_planner_half_and_no_command_line():
    bad = sorted((m, d) for m, deps in _deps(f"{PACKAGE}.driver").items() for d in deps
                 if d.startswith((f"{PACKAGE}.workflows", f"{PACKAGE}.autoplan", f"{PACKAGE}.workers",
                                  f"{PACKAGE}.cli", f"{PACKAGE}.commands")))
    assert bad == []


def test_autoplan_knows_no_particular_workflow():
    bad = sorted((m, d) for m, deps in _deps(f"{PACKAGE}.autoplan").items() for d in deps
                 if d.startswith((f"{PACKAGE}.workflows", f"{PACKAGE}.cli")))
    assert bad == []


def test_nothing_imports_the_command_line_but_the_entry_point():
    users = sorted(m for m, deps in GRAPH.items() if f"{PACKAGE}.cli" in deps)
    assert users == [f"{PACKAGE}.__main__"]
    assert not [m for m in _deps(f"{PACKAGE}.workflows") if f"{PACKAGE}.cli" in GRAPH[m]]


def test_exactly_one_training_loop():
    defs = [p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py")
            if any(isinstance(n, ast.FunctionDef) and n.name == "train_loop" for n in ast.walk(ast.parse(p.read_text())))]
    assert defs == [f"{PACKAGE}/driver/loop.py"]


def test_the_planner_imports_nothing_above_the_runtime_and_no_ray():
    planner = {m: deps for m, deps in GRAPH.items() if m.startswith(f"{PACKAGE}.planner")}
    bad = sorted((m, t) for m, deps in planner.items() for t in deps
                 if t.startswith(f"{PACKAGE}.") and not t.startswith((f"{PACKAGE}.planner", f"{PACKAGE}.runtime"))
                 and t not in LEAVES)
    assert bad == []
    code = ("import sys, pkgutil, importlib, m2flow.planner as p\n"
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(p.__path__, 'm2flow.planner.')]\n"
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_config_imports_no_workflow():
    config = {m: deps for m, deps in GRAPH.items() if m == f"{PACKAGE}.config" or m.startswith(f"{PACKAGE}.config.")}
    assert config, "no config modules found"
    bad = {m: sorted(d for d in deps if d.startswith(f"{PACKAGE}.workflows")) for m, deps in config.items()}
    assert {m: d for m, d in bad.items() if d} == {}
