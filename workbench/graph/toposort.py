"""Exporter quirks repaired at load time, before ``onnx.checker`` sees the model.

* :func:`stable_order` - the one stable topological sort (Kahn's algorithm with a heap) of
  indices with dependencies; :func:`toposort_nodes` applies it to a node list (nodes keep their
  written order wherever that order is valid; a node moves only behind the producers it needs),
  the graph drawing (``workbench.widgets.graph_data``) to Graph IR nodes, breaking cycles.
  onnxruntime's float16 converter, for one, writes graphs whose Cast nodes come after their
  consumers; onnx.checker rejects those, onnxruntime runs them. A dependency cycle is a
  :class:`ModelLoadError` naming the nodes on it.
* :func:`fix_quirks` - applies the sort to the graph and its subgraphs, turns input dims
  written as ``-1`` or ``0`` ("any size" for Paddle, older tf2onnx, some Caffe converters) into
  free dims, reads onnxruntime's ONNX-domain operators (SimplifiedLayerNormalization,
  LayerNormalization below opset 17) as com.microsoft, and describes what it changed or
  noticed (float16/bfloat16 weights behind float32 inputs, opset imports of domains no node
  uses) as notes for ``workbench info``.
"""

from __future__ import annotations

import heapq

import onnx

from workbench.errors import ModelLoadError


def _subgraphs(node):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _graph_reads(g) -> set:
    """Every value name a (sub)graph's nodes read, including nested subgraphs."""
    out = set()
    for n in g.node:
        out.update(i for i in n.input if i)
        for sg in _subgraphs(n):
            out |= _graph_reads(sg)
    return out


def stable_order(deps, *, break_cycles: bool = False):
    """The indices ``0 .. len(deps) - 1`` in a stable topological order: ``deps[i]`` holds
    the indices index ``i`` waits for. Among the indices whose dependencies are placed, the
    smallest goes first, so an already valid order comes back unchanged. Linear in indices +
    dependencies (times a log for the heap).

    Returns ``(order, stuck)``: ``stuck`` lists the indices on or behind a dependency cycle
    (empty when there is none; they are then missing from ``order``). ``break_cycles=True``
    (a drawing of an invalid model) places them anyway: when nothing is ready, the first
    unplaced index goes next, as if its missing dependencies were met; ``stuck`` still names
    every index placed that way.
    """
    n = len(deps)
    users = [[] for _ in range(n)]
    missing = [0] * n
    for i, ds in enumerate(deps):
        missing[i] = len(ds)
        for d in ds:
            users[d].append(i)
    ready = [i for i in range(n) if missing[i] == 0]
    heapq.heapify(ready)
    order, placed, forced = [], [False] * n, []
    scan = 0                       # every index below it is placed (cycle breaking)
    while len(order) < n:
        if not ready:
            if not break_cycles:
                break
            while placed[scan]:
                scan += 1
            forced.append(scan)
            missing[scan] = 0
            ready.append(scan)
        i = heapq.heappop(ready)
        if placed[i]:
            continue
        placed[i] = True
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    stuck = forced if break_cycles else [i for i in range(n) if not placed[i]]
    return order, stuck


def toposort_nodes(nodes, what: str = "graph", path: str | None = None):
    """The indices of ``nodes`` (NodeProtos) in a stable topological order.

    A node depends on the nodes of the same list producing its inputs (and the names its
    subgraphs read). Among the nodes whose inputs are ready, the one written first goes first,
    so an already sorted list comes back unchanged. Names produced by no node of the list
    (graph inputs, initializers, outer scope) are available from the start.
    """
    producer = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer.setdefault(o, idx)
    deps = []
    for idx, n in enumerate(nodes):
        reads = {i for i in n.input if i}
        for sg in _subgraphs(n):
            reads |= _graph_reads(sg)
        deps.append({producer[r] for r in reads if r in producer and producer[r] != idx})
    order, stuck = stable_order(deps)
    if stuck:
        names = [f"{nodes[i].name or '#' + str(i)} ({nodes[i].op_type})" for i in stuck[:8]]
        more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        raise ModelLoadError(
            f"the {what}'s nodes form a dependency cycle (each waits for another's output), "
            f"so no execution order exists: {', '.join(names)}{more}", path=path)
    return order


def _sort_graph(g, what: str, path) -> int:
    """Sort ``g`` (a GraphProto) in place, subgraphs first; returns how many nodes moved."""
    moved = 0
    for n in g.node:
        for sg in _subgraphs(n):
            moved += _sort_graph(sg, f"subgraph {sg.name or ''} of node {n.name or n.op_type}",
                                 path)
    order = toposort_nodes(g.node, what, path)
    if order != list(range(len(order))):
        moved += sum(1 for pos, i in enumerate(order) if pos != i)
        sorted_nodes = [onnx.NodeProto() for _ in order]
        for dst, i in zip(sorted_nodes, order):
            dst.CopyFrom(g.node[i])
        del g.node[:]
        g.node.extend(sorted_nodes)
    return moved


def _needs_sort(g) -> bool:
    known = {i.name for i in g.input} | {t.name for t in g.initializer}
    produced_later = {o for n in g.node for o in n.output if o}
    seen = set()
    for n in g.node:
        for i in n.input:
            if i and i not in known and i not in seen and i in produced_later:
                return True
        for sg in _subgraphs(n):
            if _needs_sort(sg) or any(r in produced_later and r not in seen and r not in known
                                      for r in _graph_reads(sg)):
                return True
        seen.update(o for o in n.output if o)
    return False


def _free_dims(m) -> list[str]:
    """Input dims written as -1 or 0 (output dims as -1) -> free dims; one note per value."""
    inits = {t.name for t in m.graph.initializer}
    notes = []
    for kind, vis in (("input", m.graph.input), ("output", m.graph.output)):
        for vi in vis:
            if vi.name in inits or not vi.type.HasField("tensor_type"):
                continue
            changed = []
            for k, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and (d.dim_value < 0 or (d.dim_value == 0
                                                                    and kind == "input")):
                    changed.append((k, int(d.dim_value)))
                    d.Clear()
                    d.dim_param = f"{vi.name}_dim{k}"
            if changed:
                desc = ", ".join(f"dim {k} = {v}" for k, v in changed)
                notes.append(f"{kind} {vi.name!r} declares {desc}: read as 'any size' (the "
                             f"actual size is accepted)")
    return notes


def _needs_free_dims(m) -> bool:
    inits = {t.name for t in m.graph.initializer}
    for vi in m.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        if any(d.HasField("dim_value") and d.dim_value <= 0
               for d in vi.type.tensor_type.shape.dim):
            return True
    return any(vi.type.HasField("tensor_type") and any(
        d.HasField("dim_value") and d.dim_value < 0 for d in vi.type.tensor_type.shape.dim)
        for vi in m.graph.output)


def _used_domains(g, out: set) -> set:
    for n in g.node:
        out.add(n.domain if n.domain not in ("", "ai.onnx") else "")
        for sg in _subgraphs(n):
            _used_domains(sg, out)
    return out


def _observations(m) -> list[str]:
    """Notes that change nothing: unused opset imports, half-precision weights."""
    notes = []
    used = _used_domains(m.graph, set())
    funcs = {f.domain for f in m.functions}
    unused = sorted((imp.domain or "ai.onnx") for imp in m.opset_import
                    if (imp.domain if imp.domain not in ("", "ai.onnx") else "") not in used
                    and imp.domain not in funcs and (imp.domain or "") not in ("", "ai.onnx"))
    if unused:
        notes.append(f"opset imports list domain(s) no node uses: {', '.join(unused)} "
                     f"(ignored)")
    half = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
    counts = {}
    for t in m.graph.initializer:
        if t.data_type in half:
            counts[half[t.data_type]] = counts.get(half[t.data_type], 0) + 1
    io_types = {vi.type.tensor_type.elem_type for vi in list(m.graph.input) + list(
        m.graph.output) if vi.type.HasField("tensor_type")}
    if counts and onnx.TensorProto.FLOAT in io_types:
        what = ", ".join(f"{c} {k}" for k, c in sorted(counts.items()))
        notes.append(f"weights stored in half precision ({what} initializers) behind float32 "
                     f"inputs/outputs: computed as written (Cast nodes convert at the edges)")
    return notes


# ops onnxruntime registers in the ONNX domain although onnx does not define them (there), which
# its transformer optimizer writes with domain "": read as their com.microsoft equivalents
_ORT_ONNX_DOMAIN_OPS = ("SimplifiedLayerNormalization", "LayerNormalization")


def _onnx_knows(op: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op, opset, "")
        return True
    except Exception:
        return False


def _ort_onnx_domain_nodes(m) -> list:
    opset = next((imp.version for imp in m.opset_import if imp.domain in ("", "ai.onnx")), 0)
    return [n for n in m.graph.node if n.domain in ("", "ai.onnx")
            and n.op_type in _ORT_ONNX_DOMAIN_OPS and not _onnx_knows(n.op_type, opset)]


def _move_to_ms(m) -> list[str]:
    nodes = _ort_onnx_domain_nodes(m)
    for n in nodes:
        n.domain = "com.microsoft"
    if not any(imp.domain == "com.microsoft" for imp in m.opset_import):
        m.opset_import.add(domain="com.microsoft", version=1)
    ops = sorted({n.op_type for n in nodes})
    return [f"{len(nodes)} node(s) of {', '.join(ops)} in the ai.onnx domain, where onnx does "
            f"not define them at this opset (onnxruntime's own ONNX-domain operators): read as "
            f"com.microsoft"]


def fix_quirks(m: onnx.ModelProto, path: str | None = None, *, owned: bool = True):
    """Repair what the checker would refuse but onnxruntime runs; returns (model, notes).

    ``owned=False`` (the caller's ModelProto): the model is copied before anything changes.
    """
    notes = []
    sort = _needs_sort(m.graph)
    dims = _needs_free_dims(m)
    ort_ops = bool(_ort_onnx_domain_nodes(m))
    if (sort or dims or ort_ops) and not owned:
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m = m2
    if sort:
        moved = _sort_graph(m.graph, "graph", path)
        notes.append(f"nodes were not in topological order: sorted at load ({moved} node(s) "
                     f"moved; the order is otherwise as written)")
    if dims:
        notes += _free_dims(m)
    if ort_ops:
        notes += _move_to_ms(m)
    notes += _observations(m)
    return m, notes
