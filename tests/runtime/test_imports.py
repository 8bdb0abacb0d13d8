"""The runtime's import graph: no cycles (lazy and type-only imports included), nothing from above it."""

from __future__ import annotations

import ast
from pathlib import Path

import m2flow

RUNTIME = Path(m2flow.__file__).parent / "runtime"


def _module(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    paths = {_module(p): p for p in RUNTIME.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):  # every import, in functions too
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    graph[name].add(target if target in paths else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names)
    return graph


def _is_package(module: str) -> bool:
    return (RUNTIME.parent.parent / Path(*module.split(".")) / "__init__.py").exists()


def _cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from module ``start`` back to itself, if any (packages' re-exports aside)."""
    stack, seen = [(start, [start])], {start}
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return path + [start]
            # A package's __init__ importing its own modules is how it re-exports them, not a cycle.
            if nxt not in seen and not _is_package(nxt):
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_the_runtime_has_no_import_cycles():
    imports = _imports()
    graph = {m: {t for t in targets if t in imports} for m, targets in imports.items()}
    cycles = [cycle for m in graph if not _is_package(m) if (cycle := _cycle_from(graph, m))]
    assert cycles == []


def test_the_runtime_imports_nothing_above_it():
    above = [(m, t) for m, targets in _imports().items() for t in targets
             if t.startswith("m2flow.") and not t.startswith("m2flow.runtime")]
    assert above == []
