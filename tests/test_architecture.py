"""The package's shape, as docs/architecture.md draws it: no import cycles in ``gateway/``,
dependencies pointing inward (the server layer knows nothing of the relay, the protocols
nothing of I/O), and modules and functions of a size one can read."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import a module runs, at its top or inside a function (a lazy import is still
    a dependency); not those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            yield from _imports(node)


def _resolve(name: str) -> str | None:
    """The gateway module an import name means (a module, else the package it names)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def dependencies(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.module is None or node.level:
            continue  # the package uses absolute imports only
        else:  # ``from a.b import c``: c may be a module of a.b
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names.append(node.module)
        for name in names:
            if name.split(".")[0] == "gateway":
                target = _resolve(name)
                if target is not None and target != module:
                    found.add(target)
    return found


GRAPH = {m: dependencies(m) for m in MODULES}


def reachable(start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(GRAPH[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(GRAPH[m])
    return seen


def cycles() -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a
    module importing itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles() == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: two modules importing each other are a cycle."""
    saved = dict(GRAPH)
    try:
        GRAPH["gateway.errors"] = {"gateway.types"}
        GRAPH["gateway.types"] = {"gateway.errors"}
        assert ["gateway.errors", "gateway.types"] in cycles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        # the process knows an ASGI app by its path, nothing of what it does
        ("gateway.server", ("gateway.relay", "gateway.app", "gateway.kinds", "gateway.local")),
        # pure: no I/O, no HTTP, no store
        ("gateway.protocols", ("gateway.relay", "gateway.store", "gateway.upstream",
                               "gateway.edge", "gateway.app", "gateway.operator")),
        # the store knows nothing of HTTP or the relay
        ("gateway.store", ("gateway.relay", "gateway.edge", "gateway.app", "gateway.kinds")),
        # nothing but the server and the CLI builds the app
        ("gateway.relay", ("gateway.app", "gateway.operator", "gateway.local")),
        ("gateway.operator", ("gateway.app", "gateway.relay")),
        ("gateway.local", ("gateway.app", "gateway.relay")),
    ],
)  # fmt: skip
def test_dependencies_point_inward(layer: str, forbidden: tuple[str, ...]) -> None:
    inside = [m for m in MODULES if m == layer or m.startswith(layer + ".")]
    assert inside, layer
    wrong = {
        (m, d)
        for m in inside
        for d in reachable(m)
        if any(d == f or d.startswith(f + ".") for f in forbidden)
    }
    assert not wrong, f"{layer} reaches what it must not: {sorted(wrong)}"


def _sizes() -> Iterator[tuple[str, str, int, int]]:
    """(module, what, lines, the limit) for every module and function of the package."""
    for name, path in MODULES.items():
        source = path.read_text()
        yield name, "module", len(source.splitlines()), MAX_MODULE_LINES
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                yield name, node.name, lines, MAX_FUNCTION_LINES


def test_modules_and_functions_are_of_a_size_one_can_read() -> None:
    over = [(m, what, n) for m, what, n, limit in _sizes() if n > limit]
    assert over == [], f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function"
