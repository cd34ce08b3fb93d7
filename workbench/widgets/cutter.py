"""LayerCutter: pick where to cut a model (``last_layers``), see what is removed, add a head.

>>> cutter = LayerCutter("resnet18.onnx")      # doctest: +SKIP
>>> cutter                                      # slider -1 .. -N, or click a node in the graph
>>> cutter.last_layers = -2                     # or a node name: cutter.last_layers = "flatten"
>>> cutter.outputs, cutter.model                # output names; the cut model

``last_layers`` follows the engine's counting (:func:`~workbench.runtime.cut.resolve_cut`;
``docs/architecture.md``, "SINGA's API and ``last_layers``"): -1 keeps the whole graph, -k
cuts after the k-th node from the end, counted in topological order without ``Constant``
nodes; a node or value name is also accepted. The slider steps over the layers a person sees:
the nodes the drawing shows, with constants and shape computations (folded in the drawing)
skipped, so a 12-block transformer export has a few positions per block rather than hundreds;
its readout is the ``last_layers`` value of each position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from workbench.errors import InputError
from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.graph.toposort import needed_nodes, topological_order
from workbench.runtime.cut import cut, layer_nodes, resolve_cut
from workbench.widgets._base import TextRepr, import_widgets
from workbench.widgets._html import frag, joined, tag
from workbench.widgets._model import as_source, dtype_str, fmt_shape
from workbench.widgets.graph_view import GraphView

anywidget, ipywidgets, traitlets = import_widgets()


@dataclass
class CutModel:
    """A cut (and optionally re-headed) model built at the graph level.

    ``graph`` keeps only the nodes the new outputs need (plus the head); ``frozen`` names the
    parameters a training loop should not update (all of the base model's when ``freeze``).
    ``run(feeds)`` runs it with the engine's :class:`~workbench.runtime.plan.Plan`.
    """

    graph: Graph
    outputs: list
    last_layers: object
    frozen: set = field(default_factory=set)
    head: dict | None = None

    @property
    def trainable(self) -> list:
        return [k for k in self.graph.initializers if k not in self.frozen]

    def to_proto(self, ir_version: int = 8) -> onnx.ModelProto:
        opsets = [helper.make_opsetid(d, v) for d, v in self.graph.opsets.items()]
        m = helper.make_model(self.graph.to_proto(), opset_imports=opsets,
                              producer_name="workbench.widgets.LayerCutter")
        m.ir_version = ir_version
        return m

    @property
    def proto(self) -> onnx.ModelProto:
        return self.to_proto()

    def plan(self):
        from workbench.runtime.plan import Plan
        if getattr(self, "_plan", None) is None:
            self._plan = Plan(self.graph, outputs=self.outputs)
        return self._plan

    def run(self, feeds) -> list:
        return self.plan().run(feeds)

    def __call__(self, *inputs):
        return self.run(list(inputs))


def cut_graph(graph: Graph, last_layers=-1, *, head_classes: int | None = None,
              freeze: bool = False, in_features: int | None = None, seed: int = 0) -> CutModel:
    """Cut ``graph`` at ``last_layers`` (see module docs); optionally add a Linear head
    (Flatten + Gemm with ``head_classes`` outputs) on the first new output."""
    g = cut(graph, last_layers, prune_inputs=False)
    outputs = [v.name for v in g.outputs]
    frozen = set(g.initializers) if freeze else set()
    head = None
    if head_classes:
        src = outputs[0]
        vi = graph.value(src)
        if in_features is None:
            dims = None if vi is None or vi.shape is None else vi.shape[1:]
            if dims is None or not all(isinstance(d, int) for d in dims):
                raise InputError(
                    f"cannot size the new head: the shape of {src!r} is "
                    f"{fmt_shape(vi.shape if vi else None)}, not known after the batch axis; "
                    f"pass in_features=")
            in_features = int(np.prod(dims, dtype=np.int64))
        rng = np.random.default_rng(seed)
        bound = np.sqrt(6.0 / (in_features + head_classes))
        w = rng.uniform(-bound, bound, (head_classes, in_features)).astype(np.float32)
        g.initializers["head.weight"] = w
        g.initializers["head.bias"] = np.zeros(head_classes, np.float32)
        g.nodes.append(Node("Flatten", [src], ["head.flat"], {"axis": 1}, "head_flatten"))
        g.nodes.append(Node("Gemm", ["head.flat", "head.weight", "head.bias"], ["head.logits"],
                            {"transB": 1}, "head_fc"))
        g.outputs = [ValueInfo("head.logits", onnx.TensorProto.FLOAT,
                               (vi.shape[0] if vi and vi.shape else None, head_classes))]
        outputs = ["head.logits"]
        head = {"in_features": in_features, "classes": head_classes, "source": src}
    return CutModel(g, outputs, last_layers, frozen, head)


def with_head(base, classes: int, freeze: bool = False, cache_trunk: bool = False):
    """``base`` (a workbench Model returning Tensors) followed by Flatten + ``layer.Linear``
    with ``classes`` outputs; ``freeze`` freezes the base's imported weights;
    ``cache_trunk`` (with ``freeze``) computes the frozen base's outputs once per sample and
    reuses them (``workbench.trunk_cache``; the base then runs in inference form, cached
    or not)."""
    from workbench import autograd, layer, model

    class CutWithHead(model.Model):
        """A cut model with a new Linear head (made by LayerCutter)."""

        def __init__(self):
            super().__init__()
            self.base = base
            self.head = layer.Linear(classes)

        def forward(self, *inputs):
            out = self.base.forward(*inputs)
            y = out[0] if isinstance(out, (list, tuple)) else out
            return self.head(autograd.flatten(y, 1))

    if freeze:
        if hasattr(base, "freeze_imported"):
            base.freeze_imported(inference=bool(cache_trunk))
            if cache_trunk:
                base.cache_trunk()
        else:
            for p in base.get_params().values():
                p.requires_grad = False
    return CutWithHead()


class LayerCutter(TextRepr, ipywidgets.VBox):
    """Slider (``last_layers`` -1 .. -N) + graph (click a node to cut after it) + outputs.

    Python API: ``last_layers`` (int or node/value name), ``outputs`` (list of names),
    ``head_classes`` (0 = no new head), ``freeze``, ``cache_trunk`` (with a frozen base and
    a head: the base's outputs computed once per sample, ``workbench.trunk_cache``),
    ``model`` (the result), ``removed``.
    """

    last_layers = traitlets.Union([traitlets.Int(), traitlets.Unicode()], default_value=-1)
    outputs = traitlets.List(traitlets.Unicode())
    head_classes = traitlets.Int(0)
    freeze = traitlets.Bool(False)
    cache_trunk = traitlets.Bool(False)

    def __init__(self, model, *, last_layers=-1, head_classes: int = 0, freeze: bool = False,
                 cache_trunk: bool = False, height: int = 460):
        src = as_source(model)
        self.source = src
        self.graph = src.graph
        self._layers = layer_nodes(self.graph)
        self._order = topological_order(self.graph)
        self._layer_index = {n.name: i for i, n in enumerate(self._layers)}
        self._syncing = False
        self._sonnx = None
        self.view = GraphView(src, height=height, title=f"{src.name} — cut")
        self._stops, self._shown_as = self._slider_stops()
        self._stops_by_name = {self._layers[k].name: k for k in self._stops if self._layers}
        self.slider = ipywidgets.SelectionSlider(
            options=[(str(k), k) for k in self._stops], value=-1, description="last_layers",
            continuous_update=True, layout=ipywidgets.Layout(width="420px"),
            style={"description_width": "80px"})
        self.slider.add_class("wb-cut-slider")
        self.cut_label = ipywidgets.HTML()
        self.head_box = ipywidgets.Checkbox(value=bool(head_classes), description="new head",
                                            indent=False, layout=ipywidgets.Layout(width="90px"))
        self.classes_box = ipywidgets.BoundedIntText(
            value=head_classes or 10, min=1, max=1_000_000, description="classes",
            layout=ipywidgets.Layout(width="150px"), style={"description_width": "50px"})
        self.freeze_box = ipywidgets.Checkbox(value=freeze, description="freeze base",
                                              indent=False, layout=ipywidgets.Layout(width="110px"))
        self.cache_box = ipywidgets.Checkbox(value=cache_trunk, description="cache the trunk",
                                             indent=False,
                                             layout=ipywidgets.Layout(width="130px"))
        self.info = ipywidgets.HTML()
        self.info.add_class("wb-cut-info")
        controls = ipywidgets.HBox([self.slider, self.cut_label])
        head = ipywidgets.HBox([self.head_box, self.classes_box, self.freeze_box,
                                self.cache_box])
        super().__init__([controls, head, self.view, self.info])
        self.add_class("wb-layer-cutter")
        self.slider.observe(self._on_slider, names="value")
        self.view.observe(self._on_click, names="selected")
        for w in (self.head_box, self.classes_box, self.freeze_box, self.cache_box):
            w.observe(self._on_head, names="value")
        self.head_classes = head_classes
        self.freeze = freeze
        self.cache_trunk = cache_trunk
        self.last_layers = last_layers
        self._update()

    def _slider_stops(self) -> tuple[list, dict]:
        """The slider's positions, as ``last_layers`` values in ascending order: -1 (the whole
        graph) and a cut after each node the drawing shows (constants and shape computations
        are folded into the node they feed: not a place a person cuts). Also, for each node
        the drawing folds, the shown node it is drawn in (where the slider goes for a cut
        given there by value or name)."""
        d = self.view.graph_data
        names, hosts, kinds = d.get("name", []), d.get("host", []), d.get("kind", [])
        shown = {nm for nm, h, k in zip(names, hosts, kinds) if k == 0 and h == -1}
        shown_as = {nm: names[h] for nm, h, k in zip(names, hosts, kinds) if k == 0 and h >= 0}
        n = len(self._layers)
        stops = [i - n for i, node in enumerate(self._layers[:-1]) if node.name in shown]
        return stops + [-1], shown_as

    # ------------------------------------------------------------------ events
    def _on_slider(self, change) -> None:
        if not self._syncing:
            self.last_layers = int(change["new"])

    def _on_click(self, change) -> None:
        name = change["new"]
        if name:
            try:
                resolve_cut(self.graph, name)
            except InputError:
                return
            self.last_layers = name

    def _on_head(self, change) -> None:
        if self._syncing:
            return
        self.head_classes = int(self.classes_box.value) if self.head_box.value else 0
        self.freeze = bool(self.freeze_box.value)
        self.cache_trunk = bool(self.cache_box.value)

    @traitlets.validate("last_layers")
    def _check_last_layers(self, proposal):
        value = proposal["value"]
        resolve_cut(self.graph, value)      # raises InputError with a clear message
        return value

    @traitlets.observe("last_layers", "head_classes", "freeze", "cache_trunk")
    def _on_change(self, change) -> None:
        if getattr(self, "view", None) is not None:
            self._update()

    # ------------------------------------------------------------------ state
    def _cut_node(self):
        outs = resolve_cut(self.graph, self.last_layers)
        producers = self.graph.producers()
        return outs, [producers[o] for o in outs if o in producers]

    def _update(self) -> None:
        outs, cut_nodes = self._cut_node()
        keep = needed_nodes(self._order, outs)
        kept = {n.name for n in keep}
        removed = [n.name for n in self.graph.nodes if n.name not in kept]
        removed += [v.name for v in self.graph.outputs if v.name not in outs]
        self.removed = removed
        self.outputs = outs
        self._syncing = True
        try:
            k = self.last_layers
            if len(cut_nodes) == 1 and k != -1:
                # the slider shows the cut at its node, or at the shown node a folded one is
                # drawn in (the drawing marks the same one)
                name = cut_nodes[0].name
                if name not in self._stops_by_name and \
                        self._shown_as.get(name) in self._stops_by_name:
                    name = self._shown_as[name]
                k = self._stops_by_name.get(name, k)
            if k in self._stops:
                self.slider.value = k
            if self.head_classes:
                self.classes_box.value = self.head_classes
            self.head_box.value = bool(self.head_classes)
            self.freeze_box.value = self.freeze
            self.cache_box.value = self.cache_trunk
        finally:
            self._syncing = False
        self.view.dimmed = removed
        self.view.marked = [n.name for n in cut_nodes]
        # model strings (names, op types) and error texts become HTML text through tag()
        # and frag() only (widgets/_html.py): this value is rendered with innerHTML, now and
        # whenever a saved notebook is opened again
        where = (joined(", ", [frag(tag("b", n.name), f" ({n.op_type})") for n in cut_nodes])
                 if cut_nodes else "inputs")
        # the slider counts layers as SINGA does (topological order, Constant nodes not
        # counted); the drawing marks the cut on the folded graph (the node a folded cut
        # point belongs to, or the collapsed group that holds it)
        pos = [self._layer_index[n.name] + 1 for n in cut_nodes if n.name in self._layer_index]
        count = (frag(" ", tag("span", f"· layer {pos[0]} of {len(self._layers)}",
                               cls="wb-muted wb-cut-layer")) if len(pos) == 1 else "")
        self.cut_label.value = frag(tag("span", "cut after ", where, cls="wb-cut-where"), count)
        rows = frag(*(tag("tr", tag("td", tag("code", o)), tag("td", self._desc(o)))
                      for o in outs))
        head = ""
        if self.head_classes:
            try:
                h = self.cut_graph().head
                train = ("base frozen, training updates the head only" if self.freeze
                         else "all parameters trainable")
                head = tag("div", f"+ new head: Flatten → Linear({h['in_features']} → "
                                  f"{h['classes']}); output ", tag("code", "head.logits"),
                           f"; {train}")
                if self.cache_trunk:
                    head = frag(head, tag("div", self._cache_note(), cls="wb-cut-cache"))
            except InputError as e:
                head = tag("div", f"head: {e}", style="color:#b00")
        self.info.value = frag(
            tag("div", f"keeps {len(kept)} of {len(self.graph.nodes)} nodes; new output(s):"),
            tag("table", rows), head)

    def _cache_note(self) -> str:
        if not self.freeze:
            return ("cache the trunk: needs a frozen base (tick 'freeze base'); a trainable "
                    "base computes new outputs at every step")
        return ("trunk cache: the frozen base's outputs are computed once per sample and "
                "reused in later epochs; the base runs in inference form (BatchNormalization "
                "with its running statistics, no Dropout)")

    def _desc(self, name: str) -> str:
        vi = self.graph.value(name)
        if vi is None:
            return "?"
        return f"{dtype_str(vi.dtype)} {fmt_shape(vi.shape)}"

    def _full_model(self):
        """The uncut model as a workbench Model (the user's own, or one made once from the
        ONNX proto)."""
        orig = self.source.original
        if hasattr(orig, "cut") and hasattr(orig, "forward"):
            return orig
        if self._sonnx is None:
            from workbench.sonnx import SONNXModel
            proto = self.source.proto
            if proto is None:
                proto = cut_graph(self.graph, -1).to_proto()
            self._sonnx = SONNXModel(proto)
        return self._sonnx

    @property
    def model(self):
        """The resulting model: ``Model.cut(last_layers)`` (a new ``sonnx.SONNXModel`` with
        a copy of the weights), followed by a new ``layer.Linear(head_classes)`` head when one
        is asked for (imported weights frozen when ``freeze``; with ``cache_trunk`` too, the
        cut base caches its outputs per sample: ``workbench.trunk_cache``)."""
        base = self._full_model().cut(self.last_layers)
        if self.head_classes:
            return with_head(base, self.head_classes, self.freeze,
                             cache_trunk=self.cache_trunk and self.freeze)
        return base

    def cut_graph(self) -> CutModel:
        """The cut at the graph level (no training stack): pruned Graph IR, an ONNX head
        (Flatten + Gemm) when ``head_classes`` is set, ``frozen`` parameter names."""
        return cut_graph(self.graph, self.last_layers, head_classes=self.head_classes or None,
                         freeze=self.freeze)

    def summary(self) -> str:
        outs = ", ".join(f"{o} {self._desc(o)}" for o in self.outputs)
        frozen = (" (base frozen, trunk cached)" if self.freeze and self.cache_trunk
                  else " (base frozen)" if self.freeze else "")
        head = f"; head {self.head_classes} classes{frozen}" if self.head_classes else ""
        return (f"LayerCutter({self.source.name!r}: last_layers={self.last_layers!r}, "
                f"outputs: {outs}; removes {len(self.removed)} of "
                f"{len(self.graph.nodes) + len(self.graph.outputs)} nodes/outputs{head})")
