"""GraphView: an interactive drawing of a model's graph.

>>> gv = GraphView("model.onnx")      # doctest: +SKIP
>>> gv                                 # in JupyterLab: pan (drag), zoom (wheel), search, click
>>> gv.selected                        # name of the node clicked last ('' when none)
>>> gv.observe(lambda ch: print(ch["new"]), names="selected")

What is drawn is decided in Python (:mod:`workbench.widgets.graph_data`: constants and shape
computations folded into the node that uses them, nodes grouped by the scopes in their names,
big groups split) and sent once as compact JSON. The browser lays out one group at a time
with dagre in a Web Worker, when the group is opened (double-click; breadcrumbs go back), and
draws it on a canvas. Node details (attributes, input/output shapes and dtypes, parameter
counts, what is folded into each input) are computed in Python when a node is selected and
sent in ``details``.
"""

from __future__ import annotations

import time
from collections import Counter

from workbench.widgets._base import TextRepr, esm, import_widgets
from workbench.widgets._model import Source, as_source
from workbench.widgets.graph_data import Details, build_drawing, graph_payload, node_details

__all__ = ["GraphView", "node_details"]

anywidget, ipywidgets, traitlets = import_widgets()


class GraphView(TextRepr, anywidget.AnyWidget):
    """Interactive graph of an ONNX model (path, ModelProto, LoadedModel, Model or Graph).

    Traits (synced with the browser):
      ``selected``  name of the selected node ('' for none); set it to select and centre.
      ``details``   dict describing the selected node (op, attributes, inputs/outputs).
      ``highlight`` node names drawn with a highlight ring (e.g. search results).
      ``dimmed``    node names drawn greyed out (LayerCutter uses this for the removed part).
      ``marked``    node names drawn with a thick outline (e.g. the cut point).
      ``overlay``   per-node numbers drawn as a colour scale with a legend:
                    ``{"title", "unit", "values": {node: number}, "flagged": [node, ...]}``,
                    or an analysis' metrics (FLOPs, parameters, memory, times, % of roof,
                    bound) with group totals and a summary panel
                    (:func:`workbench.analysis.overlay.overlay_payload`); set by
                    :meth:`show_analysis`, :meth:`profile` and :meth:`show_differences`;
                    ``{}`` clears it.
      ``overlay_metric``  the analysis metric shown (chosen in the legend, or set here).
      ``render_ms`` time the browser took for its first full draw (set by the front-end).
    """

    _esm = esm("graph_core.js", "graph_view.js", "graph_edit.js",
               embed=(("WB_DAGRE_SRC", "dagre.min.js"),))

    graph_data = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    details = traitlets.Dict().tag(sync=True)
    highlight = traitlets.List(traitlets.Unicode()).tag(sync=True)
    dimmed = traitlets.List(traitlets.Unicode()).tag(sync=True)
    marked = traitlets.List(traitlets.Unicode()).tag(sync=True)
    overlay = traitlets.Dict().tag(sync=True)
    overlay_metric = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(520).tag(sync=True)
    render_ms = traitlets.Float(-1.0).tag(sync=True)
    # model surgery (set by workbench.widgets.ModelEditor): the edit bar, menus and marks
    editable = traitlets.Bool(False).tag(sync=True)
    edit_state = traitlets.Dict().tag(sync=True)

    def __init__(self, model, *, height: int = 520, title: str | None = None, **kwargs):
        src = as_source(model)
        self.source: Source = src
        self.graph = src.graph
        t0 = time.perf_counter()
        builder = build_drawing(src.graph)
        data = graph_payload(src.graph, builder=builder)
        self._details = Details(src.graph, builder)     # answers selections
        self.payload_seconds = time.perf_counter() - t0
        super().__init__(graph_data=data, height=height,
                         title=title if title is not None else src.name, **kwargs)

    def _show_drawing(self, drawing) -> None:
        """Draw another version of the model in place (a ``workbench.widgets.editing.Drawing``:
        its graph, the builder that walked it and the payload)."""
        self.graph = drawing.graph
        self._details = drawing.details()
        with self.hold_sync():
            self.selected = ""
            self.details = {}
            self.graph_data = drawing.data

    @traitlets.observe("selected")
    def _on_selected(self, change) -> None:
        name = change["new"]
        self.details = self._details.of(name) if name else {}

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

    # ------------------------------------------------------------------ data on the graph
    def show_analysis(self, analysis=None, metric: str | None = None) -> dict:
        """Colour the drawing by an :class:`~workbench.analysis.Analysis` of this model (made
        with ``workbench.analysis.analyze``; run its ``roofline()``, ``profile_ours()``,
        ``profile_ort()``, ``memory()`` first for those metrics): FLOPs, parameters,
        activation memory, live memory, measured time (ours / onnxruntime), % of roof,
        compute- or memory-bound; collapsed groups show their totals, the side panel a
        legend (where the metric is chosen) and a summary. ``analysis`` None: the last one
        shown. Returns the overlay."""
        from workbench.analysis.overlay import overlay_payload

        a = analysis if analysis is not None else getattr(self, "analysis", None)
        if a is None:
            raise RuntimeError("no analysis yet: gv.show_analysis(analyze(model, shapes)) or "
                               "gv.profile(feeds)")
        ov = overlay_payload(a, metric)
        self.analysis = a
        self.overlay = ov
        self.overlay_metric = ov["metric"]
        return ov

    def profile(self, feeds, *, repeat: int = 20, metric: str = "time") -> dict:
        """Analyse the model at the shapes of ``feeds`` (a list in input order or a dict),
        time our engine per node on them (``Analysis.profile_ours``: kernel calls only, the
        run loop's own cost left out; fused steps on the node that carries their FLOPs) and
        walk its memory over the schedule (``Analysis.memory``), then colour the drawing by
        ``metric`` ("time": ms per node, "memory": bytes live after each step, or any
        analysis metric). Returns ``{node: {"ms": ..., "bytes": ...}}`` (also in
        ``profile_data``); the analysis is ``self.analysis``."""
        from workbench.analysis import analyze

        if repeat < 1:
            raise ValueError(f"repeat must be at least 1, not {repeat}")
        names = [v.name for v in self.graph.inputs]
        if isinstance(feeds, dict):
            fd = dict(feeds)
        else:
            feeds = list(feeds)
            if len(feeds) != len(names):
                raise ValueError(f"the model takes {len(names)} input(s) {names}, got "
                                 f"{len(feeds)}")
            fd = dict(zip(names, feeds))
        a = analyze(self.graph, {k: tuple(v.shape) for k, v in fd.items()})
        a.roofline()
        a.profile_ours(runs=repeat, warmup=min(3, repeat), feeds=fd)
        a.memory(feeds=fd)
        self.profile_data = {r["node"]: {"ms": r["time_ours_ms"],
                                         "bytes": r["live_bytes_after"]}
                             for r in a.records if not r["static"]}
        self.analysis = a
        self.show_profile(metric)
        return self.profile_data

    def show_profile(self, metric: str = "time") -> None:
        """Colour the drawing by the last :meth:`profile`: "time" (ours, ms per node),
        "memory" (bytes live after each step), or an analysis metric."""
        if getattr(self, "profile_data", None) is None:
            raise RuntimeError("no profile yet: call gv.profile(feeds) first")
        from workbench.analysis.overlay import metric_keys

        key = {"time": "time_ours_ms", "memory": "live_bytes_after"}.get(metric, metric)
        if key not in metric_keys():
            raise ValueError(f"metric must be 'time', 'memory' or one of {metric_keys()}, "
                             f"not {metric!r}")
        self.show_analysis(self.analysis, key)

    def show_differences(self, inspector) -> list:
        """Colour the drawing by how far each node's outputs are from the reference of a
        :class:`~workbench.widgets.TensorInspector` made with ``compare=`` (largest absolute
        difference per node) and ring the nodes whose outputs differ beyond its tolerance.
        Returns the names of those nodes, in graph order."""
        rows = [r for r in inspector.rows if "diff" in r]
        if not rows:
            raise ValueError("this inspector has no comparison: make it with "
                             "TensorInspector(model, inputs, compare='onnxruntime')")
        values: dict = {}
        flagged: list = []
        for r in rows:
            d = r["diff"]
            if isinstance(d, (int, float)) and d == d:
                values[r["node"]] = max(values.get(r["node"], 0.0), float(d))
            if not r.get("diff_ok", True) and r["node"] not in flagged:
                flagged.append(r["node"])
        self.overlay = {"title": "largest difference from the reference", "unit": "",
                        "values": values, "flagged": flagged}
        return flagged

    def summary(self) -> str:
        g = self.graph
        ops = Counter(n.op_type for n in g.nodes)
        top = ", ".join(f"{op}×{c}" for op, c in ops.most_common(6))
        more = f", +{len(ops) - 6} more op types" if len(ops) > 6 else ""
        sel = f"; selected {self.selected!r}" if self.selected else ""
        return (f"GraphView({self.title!r}: {len(g.nodes)} nodes, {len(g.inputs)} input(s), "
                f"{len(g.outputs)} output(s), {g.num_parameters():,} parameters; "
                f"{top or 'no ops'}{more}{sel})")
