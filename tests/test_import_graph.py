"""The import graph of ``workbench/``: no circles, and every import points down the layers.

Every ``import`` / ``from ... import`` in every module counts, at module level and inside
functions (lazy imports), read with ``ast`` (no module is executed). The layers, lowest first
(``docs/architecture.md``, "Where things live"); a module imports only from its own layer and
the layers below it:

0 foundation (errors, limits, files) - 1 arrays (numpy/cupy helpers, dtypes, geometry, the
engine's devices, raw CUDA kernels, the compiled CPU kernels) - 2 ops (registry, kernels) -
3 graph (IR, load, passes) - 4 runtime (Plan, the run loop, cutting, placement) - 5 autodiff
(the tape, backward, gradient rules, export) - 6 dist (communicators, the gradient reducer) -
7 front ends (the onnx.backend API, SINGA's API in ``workbench.singa`` and its old paths,
``wb.fit``, conformance) - 8 UI and tools (widgets, zoo, command line, JupyterLab server
extension, the facade).
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

import workbench

ROOT = pathlib.Path(workbench.__file__).resolve().parent
PKG = "workbench"

#: (layer number, layer name, module prefixes); a module belongs to the layer of its longest
#: matching prefix
LAYERS = [
    (0, "foundation", ("workbench.errors", "workbench.limits", "workbench.files")),
    (1, "arrays", ("workbench.arrays", "workbench.compiled")),
    (2, "ops", ("workbench.ops",)),
    (3, "graph", ("workbench.graph",)),
    (4, "runtime", ("workbench.runtime", "workbench.graph.executor",
                    "workbench.graph.segments")),
    (5, "autodiff", ("workbench.autodiff",)),
    (6, "dist", ("workbench.dist",)),
    (7, "front ends", ("workbench.backend", "workbench.singa", "workbench.training",
                       "workbench.conformance",
                       # tools over the engine: model surgery, quantization reports
                       "workbench.edit", "workbench.quantization",
                       # SINGA's old module paths: aliases of workbench.singa.* and of the
                       # gradient rules' package
                       "workbench.autograd", "workbench.tensor", "workbench.layer",
                       "workbench.model", "workbench.opt", "workbench.sonnx",
                       "workbench.device", "workbench.grad")),
    (8, "UI and tools", ("workbench", "workbench.__main__", "workbench.widgets",
                         "workbench.zoo", "workbench.cli", "workbench.labext",
                         "workbench.analysis", "workbench.classroom")),
]

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


@functools.cache
def import_edges() -> tuple[tuple[str, int, str], ...]:
    """``(module, line, imported workbench module)`` for every import (the package
    ``__init__`` of an imported submodule is left out: importing ``a.b`` runs ``a/__init__``
    but ``a`` does not depend on ``a.b`` through that)."""
    modules = _modules()
    edges = []
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
                    edges.append((mod, node.lineno, dep))
    return tuple(edges)


def import_graph() -> dict[str, set[str]]:
    """{module: {workbench modules it imports}}."""
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for mod, _, dep in import_edges():
        graph[mod].add(dep)
    return graph


def layer_of(module: str) -> tuple[int, str] | None:
    """(number, name) of ``module``'s layer, or None when no prefix matches."""
    best = None
    for number, name, prefixes in LAYERS:
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[0]:
                    best = (len(p), number, name)
    return None if best is None else best[1:]


def upward_imports(edges) -> list[tuple[str, int, str, tuple, tuple]]:
    """The imports that climb: (module, line, imported module, its layer, the target's)."""
    out = []
    for mod, line, dep in edges:
        a, b = layer_of(mod), layer_of(dep)
        if a is not None and b is not None and b[0] > a[0]:
            out.append((mod, line, dep, a, b))
    return out


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
    assert "workbench.backend" in g["workbench.singa.sonnx"]
    assert len(g) > 50 and all(isinstance(v, set) for v in g.values())
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    g = import_graph()
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if layer_of(m) is None]
    assert not missing, (f"modules in no layer of LAYERS (add their folder to the table and "
                         f"to docs/architecture.md): {missing}")


def test_imports_point_down_the_layers():
    bad = [u for u in upward_imports(import_edges())]
    lines = [f"{mod} (line {line}, layer {a[0]} {a[1]}) imports {dep} (layer {b[0]} {b[1]})"
             for mod, line, dep, a, b in bad]
    assert not bad, ("imports that climb the layers (a module imports only from its own "
                     "layer and those below):\n  " + "\n  ".join(lines))


@pytest.mark.parametrize("module, layer", [
    ("workbench.graph.export", 3), ("workbench.autodiff.tape", 5),
    ("workbench.autodiff.rules.cuda", 5), ("workbench.singa.autograd", 7),
    ("workbench.autograd", 7), ("workbench", 8), ("workbench.widgets.monitor", 8),
    ("workbench.graph.executor", 4), ("workbench.arrays.device", 1),
])
def test_layer_table(module, layer):
    assert layer_of(module)[0] == layer


def test_an_upward_import_is_named_with_its_line_and_layers():
    edges = [("workbench.ops.conv", 12, "workbench.singa.autograd"),
             ("workbench.singa.model", 3, "workbench.graph.load")]
    (mod, line, dep, a, b), = upward_imports(edges)
    assert (mod, line, dep, a, b) == ("workbench.ops.conv", 12, "workbench.singa.autograd",
                                      (2, "ops"), (7, "front ends"))
