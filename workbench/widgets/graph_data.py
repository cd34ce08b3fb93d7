"""What a graph drawing needs, as JSON-ready data: the layout with op colours and counts, and the
per-node details shown when a node is clicked.

Shared by the GraphView widget (which sends details one node at a time, on selection) and the
JupyterLab extension's server handler (:mod:`workbench.labext`, which sends them all at once).
No widget libraries are imported here.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from workbench.widgets._model import dtype_str, fmt_shape
from workbench.widgets.layout import layout_graph, op_category, op_colors


def graph_payload(graph) -> dict:
    """The layout of ``graph`` (see :func:`layout_graph`) plus ``colors`` (op type -> colour),
    ``op_counts`` (op type -> count, most common first) and ``params`` (parameter count)."""
    data = layout_graph(graph)
    counts = Counter(op for op, k in zip(data["op"], data["kind"]) if k == 0)
    data["colors"] = op_colors(data["op"])
    data["op_counts"] = dict(counts.most_common())
    data["params"] = graph.num_parameters()
    return data


def _attr_repr(v, limit: int = 80) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 8:
            return f"tensor {v.dtype}{list(v.shape)} = {np.array2string(v.ravel(), separator=', ')}"
        return f"tensor {v.dtype}{list(v.shape)}"
    if hasattr(v, "nodes") and hasattr(v, "initializers"):
        return f"graph ({len(v.nodes)} nodes)"
    if isinstance(v, bytes):
        v = v[:limit]
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _value_details(graph, v: str) -> dict:
    if not v:
        return {"name": "", "shape": "", "dtype": "", "param": False, "omitted": True}
    if v in graph.initializers:
        a = graph.initializers[v]
        return {"name": v, "shape": fmt_shape(a.shape), "dtype": str(a.dtype),
                "param": True, "count": int(np.prod(a.shape, dtype=np.int64))}
    vi = graph.value(v)
    return {"name": v, "shape": fmt_shape(vi.shape if vi else None),
            "dtype": dtype_str(vi.dtype if vi else None), "param": False}


def _op_node_details(graph, node) -> dict:
    ins = [_value_details(graph, v) for v in node.inputs]
    return {
        "name": node.name, "op": node.op_type, "domain": node.domain or "ai.onnx",
        "category": op_category(node.op_type),
        "attrs": {k: _attr_repr(v) for k, v in sorted(node.attrs.items())},
        "inputs": ins, "outputs": [_value_details(graph, v) for v in node.outputs],
        "params": int(sum(i.get("count", 0) for i in ins)),
        "doc": (node.doc_string or "")[:300],
    }


def _io_details(graph, vi, kind: str) -> dict:
    return {"name": vi.name, "op": kind, "attrs": {}, "params": 0,
            "inputs": [], "outputs": [{"name": vi.name, "shape": fmt_shape(vi.shape),
                                       "dtype": dtype_str(vi.dtype), "param": False}]}


def node_details(graph, name: str) -> dict:
    """What the details panel shows for a node (or a graph input/output value) ``name``."""
    node = graph.node_by_name(name)
    if node is not None:
        return _op_node_details(graph, node)
    vi = graph.value(name)
    if vi is None:
        return {"name": name, "missing": True}
    kind = "Input" if any(v.name == name for v in graph.inputs) else "Output"
    return _io_details(graph, vi, kind)


def all_node_details(graph) -> dict:
    """``node_details`` for every name the drawing shows (graph inputs, nodes, graph outputs),
    keyed by name; the first node wins where names repeat (as in :func:`node_details`).
    Linear in the graph size (no per-name search)."""
    out: dict[str, dict] = {}
    for vi in graph.inputs:
        out.setdefault(vi.name, _io_details(graph, vi, "Input"))
    nodes: dict[str, dict] = {}
    for node in graph.nodes:
        if node.name not in nodes:
            nodes[node.name] = _op_node_details(graph, node)
    out.update(nodes)            # a node named like an input: node_by_name finds the node
    for vi in graph.outputs:
        out.setdefault(vi.name, _io_details(graph, vi, "Output"))
    return out
