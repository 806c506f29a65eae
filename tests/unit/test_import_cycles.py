"""No import cycle among the project's modules, counting the imports inside functions too (they
would otherwise hide an edge: docs/architecture.md "Imports"). Imports under `if TYPE_CHECKING:`
are annotations only and never run, so they are not edges."""

from __future__ import annotations

import ast
from pathlib import Path

from streamops.paths import PROJECT_ROOT

ROOTS = {"streamops": PROJECT_ROOT / "plugins" / "streamops", "spark_apps": PROJECT_ROOT / "spark_apps"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in ROOTS.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(child) for block in node.body for child in ast.walk(block)}
    return skipped


def import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_blocks(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                module = owner(target)
                # A package's own submodules may import it (its __init__), not the other way round.
                if module and module != name and not name.startswith(module + "."):
                    graph[name].add(module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph()
    assert {"streamops.driver.run", "streamops.catalog", "spark_apps.oplog_router"} <= set(graph)
    assert "streamops.catalog" in graph["streamops.driver.run"]  # the graph sees real edges
    assert cycles(graph) == []


def test_the_checker_finds_a_cycle_made_of_function_level_imports():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
