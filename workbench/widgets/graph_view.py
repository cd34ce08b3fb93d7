"""GraphView: an interactive drawing of a model's graph.

>>> gv = GraphView("model.onnx")      # doctest: +SKIP
>>> gv                                 # in JupyterLab: pan (drag), zoom (wheel), search, click
>>> gv.selected                        # name of the node clicked last ('' when none)
>>> gv.observe(lambda ch: print(ch["new"]), names="selected")

The layout is computed in Python (:mod:`workbench.widgets.layout`) and sent once as compact
JSON; the browser only draws. Node details (attributes, input/output shapes and dtypes,
parameter counts) are computed in Python when a node is selected and sent in ``details``.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from workbench.widgets._base import TextRepr, esm, import_widgets
from workbench.widgets._model import Source, as_source, dtype_str, fmt_shape
from workbench.widgets.layout import layout_graph, op_category, op_colors

anywidget, ipywidgets, traitlets = import_widgets()


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


def node_details(graph, name: str) -> dict:
    """What the details panel shows for a node (or a graph input/output value) ``name``."""
    node = graph.node_by_name(name)
    if node is None:
        vi = graph.value(name)
        if vi is None:
            return {"name": name, "missing": True}
        kind = "Input" if any(v.name == name for v in graph.inputs) else "Output"
        return {"name": name, "op": kind, "attrs": {}, "params": 0,
                "inputs": [], "outputs": [{"name": name, "shape": fmt_shape(vi.shape),
                                           "dtype": dtype_str(vi.dtype), "param": False}]}

    def value(v: str) -> dict:
        if not v:
            return {"name": "", "shape": "", "dtype": "", "param": False, "omitted": True}
        if v in graph.initializers:
            a = graph.initializers[v]
            return {"name": v, "shape": fmt_shape(a.shape), "dtype": str(a.dtype),
                    "param": True, "count": int(np.prod(a.shape, dtype=np.int64))}
        vi = graph.value(v)
        return {"name": v, "shape": fmt_shape(vi.shape if vi else None),
                "dtype": dtype_str(vi.dtype if vi else None), "param": False}

    ins = [value(v) for v in node.inputs]
    return {
        "name": node.name, "op": node.op_type, "domain": node.domain or "ai.onnx",
        "category": op_category(node.op_type),
        "attrs": {k: _attr_repr(v) for k, v in sorted(node.attrs.items())},
        "inputs": ins, "outputs": [value(v) for v in node.outputs],
        "params": int(sum(i.get("count", 0) for i in ins)),
        "doc": (node.doc_string or "")[:300],
    }


class GraphView(TextRepr, anywidget.AnyWidget):
    """Interactive graph of an ONNX model (path, ModelProto, LoadedModel, Model or Graph).

    Traits (synced with the browser):
      ``selected``  name of the selected node ('' for none); set it to select and centre.
      ``details``   dict describing the selected node (op, attributes, inputs/outputs).
      ``highlight`` node names drawn with a highlight ring (e.g. search results).
      ``dimmed``    node names drawn greyed out (LayerCutter uses this for the removed part).
      ``marked``    node names drawn with a thick outline (e.g. the cut point).
      ``render_ms`` time the browser took for its first full draw (set by the front-end).
    """

    _esm = esm("graph_core.js", "graph_view.js")

    graph_data = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    details = traitlets.Dict().tag(sync=True)
    highlight = traitlets.List(traitlets.Unicode()).tag(sync=True)
    dimmed = traitlets.List(traitlets.Unicode()).tag(sync=True)
    marked = traitlets.List(traitlets.Unicode()).tag(sync=True)
    height = traitlets.Int(520).tag(sync=True)
    render_ms = traitlets.Float(-1.0).tag(sync=True)

    def __init__(self, model, *, height: int = 520, title: str | None = None, **kwargs):
        src = as_source(model)
        self.source: Source = src
        self.graph = src.graph
        t0 = time.perf_counter()
        data = layout_graph(src.graph)
        self.layout_seconds = time.perf_counter() - t0
        counts = Counter(op for op, k in zip(data["op"], data["kind"]) if k == 0)
        data["colors"] = op_colors(data["op"])
        data["op_counts"] = dict(counts.most_common())
        data["params"] = src.graph.num_parameters()
        super().__init__(graph_data=data, height=height,
                         title=title if title is not None else src.name, **kwargs)

    @traitlets.observe("selected")
    def _on_selected(self, change) -> None:
        name = change["new"]
        self.details = node_details(self.graph, name) if name else {}

    @property
    def node_names(self) -> list:
        return [n.name for n in self.graph.nodes]

    def select(self, name: str) -> None:
        """Select (and centre on) a node by name."""
        if name and self.graph.node_by_name(name) is None and self.graph.value(name) is None:
            raise KeyError(f"no node or value named {name!r}")
        self.selected = name

    def search(self, text: str) -> list:
        """Names of nodes whose name or op type contains ``text`` (case-insensitive); they
        are highlighted in the drawing."""
        t = text.lower()
        hits = [n.name for n in self.graph.nodes if t in n.name.lower() or t in n.op_type.lower()]
        self.highlight = hits
        return hits

    def summary(self) -> str:
        g = self.graph
        ops = Counter(n.op_type for n in g.nodes)
        top = ", ".join(f"{op}×{c}" for op, c in ops.most_common(6))
        more = f", +{len(ops) - 6} more op types" if len(ops) > 6 else ""
        sel = f"; selected {self.selected!r}" if self.selected else ""
        return (f"GraphView({self.title!r}: {len(g.nodes)} nodes, {len(g.inputs)} input(s), "
                f"{len(g.outputs)} output(s), {g.num_parameters():,} parameters; "
                f"{top or 'no ops'}{more}{sel})")
