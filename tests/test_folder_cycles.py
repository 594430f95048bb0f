"""No cycle between package folders: the picture in docs/architecture.md holds.

import-linter pins the layers inside each package; this check looks one level up. Each
product module belongs to the folder (package) that holds it; every import of another
product module draws an arrow from its folder to the imported module's folder (``import
a.b`` and ``from a import b`` alike, ``b`` counted as a module when it is one, as its
package otherwise). The graph of folders must be acyclic, so a reader can follow the
packages one way, from the CLI down to the shared kernel. On failure the message names one
cycle and, for each arrow in it, one import that draws it.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("exporter", "sharder", "federation", "thanos", "alertmanager", "logs")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name == "__main__.py":
                continue  # ``python -m pkg``'s shim: the outermost edge, imported by nobody
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _folder(module: str, modules: dict[str, Path]) -> str:
    """The package folder a module lives in (a package's ``__init__`` is in its own folder)."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _imported(tree: ast.AST, here: str) -> Iterator[tuple[str, int]]:
    package = here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}", node.lineno
            yield module, node.lineno


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def folder_graph() -> dict[str, dict[str, str]]:
    """folder -> {imported folder: "module:line" of one import that draws the arrow}."""
    modules = _modules()
    graph: dict[str, dict[str, str]] = {}
    for module, path in modules.items():
        here = _folder(module, modules)
        arrows = graph.setdefault(here, {})
        # Relative imports in a package's __init__ resolve against the package itself.
        anchor = f"{module}.__init__" if path.name == "__init__.py" else module
        for name, line in _imported(ast.parse(path.read_text(), str(path)), anchor):
            target = _resolve(name, modules)
            if target is None:
                continue
            there = _folder(target, modules)
            if there != here:
                arrows.setdefault(there, f"{module}:{line}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle as a closed path of folders, or None; iterative DFS with colours."""
    colour: dict[str, int] = {}
    for start in sorted(graph):
        if colour.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, {}))))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif not colour.get(child):
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, {})))))
    return None


def test_find_cycle_names_the_cycle() -> None:
    graph = {"a": {"b": "a.x:1"}, "b": {"c": "b.y:2"}, "c": {"a": "c.z:3"}, "d": {"a": "d:4"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    del graph["c"]["a"]
    assert find_cycle(graph) is None


def test_folder_graph_sees_the_product() -> None:
    graph = folder_graph()
    assert "sharder.kernel" in graph.get("thanos", {})
    assert "federation.controller.http" in graph.get("federation.commands", {})
    assert "federation.controller.base" in graph.get("federation.controller.stores", {})


def test_no_folder_level_cycle() -> None:
    graph = folder_graph()
    cycle = find_cycle(graph)
    if cycle:
        arrows = [f"{a} -> {b} ({graph[a][b]})" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("folder-level import cycle:\n  " + "\n  ".join(arrows))
