"""The import graph of ``workbench/`` has no circles.

Every ``import`` / ``from ... import`` in every module counts, at module level and inside
functions (lazy imports), read with ``ast`` (no module is executed). Layers:
arrays -> ops -> graph/engine -> tensor/autograd -> SINGA-compatible modules ->
facade/widgets/zoo; nothing imports upward.
"""

from __future__ import annotations

import ast
import pathlib

import workbench

ROOT = pathlib.Path(workbench.__file__).resolve().parent
PKG = "workbench"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, modules) -> str | None:
    """The workbench module a dotted name refers to (a module, or a name inside one)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """{module: {workbench modules it imports}} (the package ``__init__`` of an imported
    submodule is left out: importing ``a.b`` runs ``a/__init__`` but ``a`` does not depend on
    ``a.b`` through that)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # "from pkg import name": the submodule pkg.name when there is one, else pkg
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix
                           for a in node.names]
            for t in targets:
                if t != PKG and not t.startswith(PKG + "."):
                    continue
                dep = _resolve(t, modules)
                if dep is not None and dep != mod:
                    graph[mod].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m):
        color[m] = GREY
        stack.append(m)
        for d in sorted(graph[m]):
            if color[d] == GREY:
                return stack[stack.index(d):] + [d]
            if color[d] == WHITE:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            c = visit(m)
            if c:
                return c
    return None


def test_walker_sees_lazy_imports_and_finds_cycles():
    g = import_graph()
    # a function-level import is an edge (sonnx imports backend inside a method)
    assert len(g) > 50 and all(isinstance(v, set) for v in g.values())
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    g = import_graph()
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
