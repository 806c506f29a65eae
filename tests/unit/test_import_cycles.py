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


# ---------------------------------------------------------------------------------------------
# The policy on function-level imports (docs/architecture.md "Imports"): one of the project's own
# modules is imported inside a function only when importing it at the top would load a heavy
# third-party package the importing module does not load already (Airflow and pyspark at DAG-parse
# time or in the CLI, GX anywhere). Everything else is imported at the top, where it shows.

HEAVY = {"airflow", "pyspark", "great_expectations"}


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is loaded: not in a function or class, not TYPE_CHECKING's."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            for block in ("body", "orelse", "finalbody"):
                visit(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    visit(tree.body)
    return found


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)] if node.level == 0 else []
    return [alias.name for alias in node.names]


def heavy_packages_loaded() -> dict[str, set[str]]:
    """module -> the heavy third-party packages loading it loads (its top-level imports, followed
    through the project's modules and their parent packages)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    own: dict[str, set[str]] = {}
    heavy: dict[str, set[str]] = {}
    for name, path in modules.items():
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        own[name] = {p for p in parents if p in modules}
        heavy[name] = set()
        for node in _top_level_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node):
                module = owner(target)
                if module and module != name:
                    own[name].add(module)
                elif target.split(".")[0] in HEAVY:
                    heavy[name].add(target.split(".")[0])
    loaded: dict[str, set[str]] = {}

    def load(name: str, seen: frozenset[str]) -> set[str]:
        if name not in loaded:
            found = set(heavy[name])
            for other in own[name] - seen:
                found |= load(other, seen | {name})
            loaded[name] = found
        return loaded[name]

    for name in modules:
        load(name, frozenset())
    return loaded


def function_level_imports_without_reason() -> list[str]:
    modules = _modules()
    loaded = heavy_packages_loaded()
    found = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_blocks(tree)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in skipped:
                    continue
                targets = {t for t in _imported(node) if t in modules and t != name}
                if path.name == "__init__.py" and all(t.startswith(name + ".") for t in targets):
                    continue  # a package's own module, which imports the package: at the top, a cycle
                if targets and not set().union(*(loaded[t] for t in targets)) - loaded[name]:
                    where = path.relative_to(PROJECT_ROOT)
                    found.append(f"{where}:{node.lineno} {ast.unparse(node)} (loads nothing heavy {name} does not)")
    return found


def test_the_projects_own_modules_are_imported_inside_a_function_only_to_defer_a_heavy_package():
    loaded = heavy_packages_loaded()
    assert "pyspark" in loaded["streamops.driver.run"] and "pyspark" not in loaded["streamops.catalog"]
    assert function_level_imports_without_reason() == []
