"""``analyze(model, shapes)``: one row per node of what it costs, and the table around it.

>>> from workbench.analysis import analyze                          # doctest: +SKIP
>>> a = analyze("resnet18.onnx", shapes={"input": (1, 3, 224, 224)}) # doctest: +SKIP
>>> a.totals()["macs"] / 1e9                                        # doctest: +SKIP
1.814
>>> a.table()          # a pandas DataFrame (a list of dicts without pandas)   # doctest: +SKIP
>>> a.groups()         # per name scope                                         # doctest: +SKIP
>>> a.to_csv("resnet18.csv"); print(a.to_markdown(top=10))                      # doctest: +SKIP

Columns (:data:`COLUMNS`; units: FLOPs, elements, bytes, milliseconds):

- ``node``, ``op`` (``domain::Op`` outside ai.onnx), ``group`` (the node's name scope, as the
  graph viewer groups it: ``layer1/layer1.0``; "" at the top), ``output_shape``, ``dtype``;
- ``macs``, ``flops`` (conventions: :mod:`workbench.analysis.costs`), ``params`` /
  ``buffers`` (weight elements attributed to this node: :mod:`workbench.analysis.weights`),
  ``param_bytes``, ``bytes_read``, ``bytes_written``, ``activation_bytes`` (its outputs),
  ``intensity`` (FLOPs per byte moved);
- roofline (after :meth:`Analysis.roofline`): ``bound`` ("compute" / "memory"),
  ``roof_flops_per_s`` (the attainable rate at this intensity), ``roof_time_ms`` (the least
  time the machine's peaks allow);
- measured: ``time_ort_ms`` (onnxruntime's profiler, :meth:`Analysis.with_ort`),
  ``time_ours_ms`` and ``live_bytes_after`` (our engine; phase 2), ``pct_of_roof`` (roofline
  time / measured time, from ours when known, else onnxruntime's), ``ort_kernel`` (the
  onnxruntime kernel that ran this node, possibly fused with others);
- ``static`` (every input constant: folded once at load, not counted in the totals),
  ``shapes_from`` ("onnx": shape inference; "run": our engine's run at the bound shapes;
  "unknown"), ``note``.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections import OrderedDict

import onnx

from workbench.errors import InputError
from workbench.graph.ir import Graph
from workbench.graph.load import LoadedModel, load
from workbench.graph.scopes import scope_of

from . import costs as _costs
from . import shapes as _shapes
from . import weights as _weights
from ._units import human

#: ONNX element types of float tensors (FLOAT16, FLOAT, DOUBLE, BFLOAT16)
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT,
                          onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16})

COLUMNS = ("node", "op", "group", "output_shape", "dtype", "macs", "flops", "params",
           "buffers", "param_bytes", "bytes_read", "bytes_written", "activation_bytes",
           "intensity", "bound", "roof_flops_per_s", "roof_time_ms", "time_ours_ms",
           "time_ort_ms", "pct_of_roof", "live_bytes_after", "ort_kernel", "static",
           "shapes_from", "note")

#: columns filled by measurements (:meth:`Analysis.set_values`)
MEASURED = ("time_ours_ms", "time_ort_ms", "live_bytes_after")

#: columns summed in totals and group tables
SUMMED = ("macs", "flops", "params", "buffers", "param_bytes", "bytes_read", "bytes_written",
          "activation_bytes", "roof_time_ms", "time_ours_ms", "time_ort_ms")


def _as_model(model, check: bool):
    """(ModelProto with resolved external data, label, declared inputs) of a path, bytes,
    ModelProto, LoadedModel or Graph IR."""
    if isinstance(model, LoadedModel):
        return model.proto, model.path or "(in memory)", model.graph.inputs
    if isinstance(model, Graph):
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in sorted(model.opsets.items())]
        m = onnx.helper.make_model(model.to_proto(), opset_imports=opsets,
                                   producer_name="workbench.analysis")
        return m, f"graph {model.name!r}", model.inputs
    pre = load(model, check=check, shape_inference=False)
    label = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "(in memory)"
    return pre.proto, label, pre.graph.inputs


def analyze(model, shapes: dict | None = None, *, dims: dict | None = None,
            default_dim: int | None = None, optimized: bool = False,
            run_unknown: bool = True, check: bool = False, weights: bool = True) -> Analysis:
    """Static analysis of ``model`` (a path, bytes, ``onnx.ModelProto``, a loaded model or a
    ``workbench.graph.ir.Graph``, e.g. an optimised one) at concrete input shapes.

    ``shapes``: {input name: shape}; ``dims``: {symbolic dim name: size}; dims left unbound
    are an ``InputError`` unless ``default_dim`` is given. ``optimized``: analyse the graph
    our engine runs (constant folding, BatchNorm folding, fusions into
    ``com.workbench::FusedConv`` / ``FusedMatMul`` / ``FusedAttention``) instead of the graph as
    written. ``run_unknown``: where onnx's shape inference leaves a shape unknown, run our
    engine once on random inputs at those shapes to find it (rows say which).
    ``weights=False`` (a path, or a structure-only ``load(path, weights=False)``): read the
    structure only, as the JupyterLab viewer does: the counts need the weights' sizes, not
    their values; nothing can run then (no ``run_unknown``, no measurements).
    """
    if isinstance(model, LoadedModel) and not model.weights:
        weights = False
    if not weights:
        path = model.path if isinstance(model, LoadedModel) else model
        if not isinstance(path, (str, os.PathLike)):
            raise InputError("analyze(weights=False) reads a model file without its weights: "
                             "give its path")
        pre = load(path, check=check, shape_inference=False, weights=False)
        bound = _shapes.bind(pre.graph.inputs, shapes, dims, default_dim)
        loaded = load(path, check=False, input_shapes=bound, weights=False)
        label = os.fspath(path)
        run_unknown = False
    else:
        proto, label, inputs = _as_model(model, check)
        bound = _shapes.bind(inputs, shapes, dims, default_dim)
        loaded = load(proto, check=False, input_shapes=bound)
    graph = loaded.graph
    notes = []
    if optimized:
        from workbench.graph import passes  # noqa: PLC0415

        graph = passes.optimize(graph)
        notes.append("analysed the optimised graph (what our engine runs)")
    source = {}
    value = graph.value_lookup()
    for name in _all_values(graph):
        vi = value(name)
        if vi is not None and _shapes.is_known(vi.shape):
            source[name] = "onnx"
    extra: dict = {}
    values: dict = {}
    unknown = [o for n in graph.nodes for o in n.outputs if o and o not in source]
    want = _wanted_values(graph)
    if (unknown or want) and run_unknown:
        run_proto = loaded.proto if not optimized else _as_model(graph, False)[0]
        found, values, note = _shapes.complete_by_running(run_proto, graph, unknown, bound,
                                                          want)
        if unknown:
            notes.append(note)
        for k, (s, t) in found.items():
            extra[k] = (s, t)
            source[k] = "run"
    elif unknown:
        notes.append(f"{len(unknown)} value shape(s) unknown after shape inference "
                     f"(run_unknown=False)")
    a = Analysis(graph, bound, source, extra, label, notes, values)
    a.proto = loaded.proto
    a.optimized = optimized
    return a


def _wanted_values(graph) -> tuple:
    """Inputs whose values a cost rule reads (``costs.VALUE_INPUTS``) and that are not
    constants: computed at run time from shapes."""
    consts = set(graph.initializers) | {o for n in graph.nodes if n.op_type == "Constant"
                                        for o in n.outputs}
    out = []
    for n in graph.nodes:
        for k in _costs.VALUE_INPUTS.get((n.domain or "", n.op_type), ()):
            if k < len(n.inputs) and n.inputs[k] and n.inputs[k] not in consts:
                out.append(n.inputs[k])
    return tuple(dict.fromkeys(out))


def _all_values(graph) -> list:
    names = [v.name for v in graph.inputs] + list(graph.initializers)
    for n in graph.nodes:
        names += [x for x in n.inputs if x] + [o for o in n.outputs if o]
    return list(OrderedDict.fromkeys(names))


class Analysis:
    """Per-node costs of one graph at bound input shapes (see the module docstring)."""

    def __init__(self, graph, bound: dict, source: dict, extra: dict, label: str, notes,
                 values: dict | None = None):
        self.graph = graph
        self.input_shapes = dict(bound)
        self.label = label
        self.notes = [n for n in notes if n]
        self.peaks = None
        self.ort = None
        self._fused: dict = {}     # anchor node -> the nodes one onnxruntime kernel ran
        self.proto = None          # the model at the bound shapes (what profile_ort runs)
        self.optimized = False     # the graph is the engine's optimised one
        self.ours = None           # timing.PlanTimes of profile_ours
        self._fused_ours: dict = {}  # anchor node -> the nodes one of our fused steps ran
        self._plan = None
        self.timeline = None       # memory.MemoryTimeline of memory() (inference)
        self.training_timeline = None
        self._source = source
        self._extra = extra
        self._run_values = dict(values or {})
        self._value = graph.value_lookup()
        consts = _weights.constants(graph)
        self._consts = consts
        self.static = _weights.static_nodes(graph, consts)
        self.weights = _weights.find_weights(graph, consts, self.static)
        self.records = self._rows()

    # ------------------------------------------------------------------ building
    def shape_of(self, name: str):
        if name in self._extra:
            return self._extra[name][0]
        vi = self._value(name)
        return None if vi is None else vi.shape

    def type_of(self, name: str):
        if name in self._extra and self._extra[name][1]:
            return self._extra[name][1]
        vi = self._value(name)
        if vi is not None and vi.dtype:
            return vi.dtype
        c = self._consts.get(name)
        if c is not None:
            from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415
            try:
                return onnx_dtype_of_np(c[0].dtype)
            except (TypeError, KeyError, ValueError):
                return None
        return None

    def _const_of(self, name: str):
        c = self._consts.get(name)
        return self._run_values.get(name) if c is None else c[0]

    def _rows(self) -> list:
        g = self.graph
        owned: dict = {}
        for w in self.weights.values():
            if w.owner is not None:
                owned.setdefault(w.owner, []).append(w)
        rows = []
        for n in g.nodes:
            if n.op_type == "Constant" and (n.domain or "") in ("", "ai.onnx"):
                continue
            rows.append(self._row(n, owned.get(n.name, [])))
        return rows

    def _row(self, n, owned) -> dict:
        dom = n.domain if n.domain not in ("ai.onnx",) else ""
        op = f"{dom}::{n.op_type}" if dom else n.op_type
        r = dict.fromkeys(COLUMNS)
        r.update(node=n.name, op=op, group="/".join(scope_of(n.name)),
                 static=n.name in self.static, note="")
        r["params"] = sum(w.size for w in owned if w.kind == "parameter")
        r["buffers"] = sum(w.size for w in owned if w.kind == "buffer")
        r["param_bytes"] = sum(w.nbytes for w in owned)
        outs = [o for o in n.outputs if o]
        if outs:
            s = self.shape_of(outs[0])
            r["output_shape"] = None if s is None else tuple(s)
            t = self.type_of(outs[0])
            r["dtype"] = _dtype_name(t)
        srcs = {self._source.get(x, "unknown") for x in list(n.inputs) + outs if x
                and x not in self._consts}
        r["shapes_from"] = ("unknown" if "unknown" in srcs else "run" if "run" in srcs
                            else "onnx")
        opset = g_opset(self.graph, dom)
        view = _costs.NodeView(n, self.shape_of, self.type_of, self._const_of, opset)
        try:
            c = (_costs.control_flow_cost(view, self._body_cost) if n.subgraphs
                 else _costs.node_cost(view))
        except _costs.Unknown as e:
            r["note"] = f"cost unknown: {e}"
            c = None
        except (ValueError, TypeError, IndexError, ZeroDivisionError, KeyError) as e:
            r["note"] = f"cost unknown: the node's attributes or shapes do not fit {op} ({e})"
            c = None
        if c is not None:
            r["macs"] = int(c.macs) if c.macs is not None else None
            r["flops"] = int(c.flops) if c.flops is not None else None
            if c.note:
                r["note"] = c.note
        r["bytes_read"] = self._bytes(view, [x for x in n.inputs if x], c and c.bytes_read)
        r["bytes_written"] = self._bytes(view, outs, c and c.bytes_written)
        r["activation_bytes"] = self._bytes(view, outs, None)
        moved = (r["bytes_read"] or 0) + (r["bytes_written"] or 0)
        if r["flops"] is not None and r["bytes_read"] is not None \
                and r["bytes_written"] is not None:
            r["intensity"] = r["flops"] / moved if moved else (math.inf if r["flops"] else 0.0)
        return r

    def _body_cost(self, body, outer=None) -> tuple:
        """(MACs, FLOPs, nodes without a count) of one run of a subgraph ``body``; names it
        does not define come from the enclosing graph(s)."""
        outer = outer or (self.shape_of, self.type_of, self._const_of)
        consts = _weights.constants(body)

        def shape_of(name):
            vi = body.value(name)
            return vi.shape if vi is not None and vi.shape is not None else outer[0](name)

        def type_of(name):
            vi = body.value(name)
            return vi.dtype if vi is not None and vi.dtype else outer[1](name)

        def const_of(name):
            return consts[name][0] if name in consts else outer[2](name)

        macs = flops = unknown = 0
        for n in body.nodes:
            if n.op_type == "Constant" and (n.domain or "") in ("", "ai.onnx"):
                continue
            dom = n.domain if n.domain != "ai.onnx" else ""
            view = _costs.NodeView(n, shape_of, type_of, const_of, g_opset(self.graph, dom))
            try:
                c = (_costs.control_flow_cost(
                    view, lambda g: self._body_cost(g, (shape_of, type_of, const_of)))
                     if n.subgraphs else _costs.node_cost(view))
            except (_costs.Unknown, ValueError, TypeError, IndexError, KeyError,
                    ZeroDivisionError):
                c = None
            if c is None or c.flops is None:
                unknown += 1
                continue
            macs += c.macs or 0
            flops += c.flops
        return macs, flops, unknown

    @staticmethod
    def _bytes(view, names, override):
        if override is not None:
            return int(override)
        total = 0
        for x in dict.fromkeys(names):
            try:
                total += view.nbytes(x)
            except _costs.Unknown:
                return None
        return total

    # ------------------------------------------------------------------ measured columns
    def set_values(self, column: str, values: dict) -> Analysis:
        """Fill a measured column (``time_ours_ms``, ``time_ort_ms``, ``live_bytes_after``)
        from {node name: value}: how measurements made elsewhere (our executor's per-node
        times and memory, phase 2) join the table. Names not in the graph are refused."""
        if column not in MEASURED:
            raise InputError(f"set_values: {column!r} is not a measured column "
                             f"({', '.join(MEASURED)})")
        known = {r["node"] for r in self.records}
        bad = [k for k in values if k not in known]
        if bad:
            raise InputError(f"set_values: no node named {bad[:5]} in this graph")
        for r in self.records:
            if r["node"] in values:
                v = values[r["node"]]
                r[column] = None if v is None else (int(v) if column == "live_bytes_after"
                                                    else float(v))
        self._pct()
        return self

    def set_times(self, times: dict, column: str = "time_ours_ms") -> Analysis:
        """Fill ``column`` ("time_ours_ms" or "time_ort_ms") from {node name: milliseconds}
        and recompute ``pct_of_roof``. Names not in the graph are refused."""
        if column not in ("time_ours_ms", "time_ort_ms"):
            raise InputError(f"set_times: column {column!r} is not a time column "
                             f"(time_ours_ms, time_ort_ms)")
        return self.set_values(column, times)

    def _pct(self) -> None:
        fused = getattr(self, "_fused", {})
        fused_ours = getattr(self, "_fused_ours", {})
        for r in self.records:
            ours = r["time_ours_ms"] is not None
            t = r["time_ours_ms"] if ours else r["time_ort_ms"]
            roof = r["roof_time_ms"]
            group = (fused_ours if ours else fused).get(r["node"])
            if group and self.peaks is not None:
                roof = self.group_roof_ms(group)
            r["pct_of_roof"] = 100.0 * roof / t if t and roof else None

    def group_roof_ms(self, names) -> float | None:
        """The roofline time of several nodes run as one kernel (a fusion): their FLOPs
        together, and only the bytes that cross the group's border (inputs from outside,
        outputs read outside or by the graph's caller)."""
        from . import roofline as _roof  # noqa: PLC0415

        if self.peaks is None:
            return None
        names = set(names)
        nodes = [n for n in self.graph.nodes if n.name in names]
        inside = {o for n in nodes for o in n.outputs if o}
        outside_use = {x for n in self.graph.nodes if n.name not in names for x in n.inputs}
        outside_use |= {v.name for v in self.graph.outputs}
        rows = {r["node"]: r for r in self.records}
        flops = sum((rows[n.name]["flops"] or 0) for n in nodes if n.name in rows)
        moved = 0
        for n in nodes:
            view = _costs.NodeView(n, self.shape_of, self.type_of, self._const_of, None)
            try:
                moved += sum(view.nbytes(x) for x in dict.fromkeys(n.inputs)
                             if x and x not in inside)
                moved += sum(view.nbytes(o) for o in n.outputs if o and o in outside_use)
            except _costs.Unknown:
                return None
        return _roof.place(flops, moved, self.peaks).time_s * 1e3

    def roofline(self, peaks=None, *, recalibrate: bool = False,
                 threads: int | None = None) -> Analysis:
        """Place every node against this machine's roofline (``peaks`` a
        :class:`~workbench.analysis.roofline.Peaks`; measured once and cached when None, on
        ``threads`` threads: by default the engine's worker threads with BLAS on one thread
        in each, as :meth:`profile_ours` times; ``threads=1`` for one core)."""
        from . import roofline as _roof  # noqa: PLC0415

        peaks = peaks if peaks is not None else _roof.measure_peaks(recalibrate=recalibrate,
                                                                    threads=threads)
        self.peaks = peaks
        for r in self.records:
            if r["flops"] is None or r["bytes_read"] is None or r["bytes_written"] is None:
                r["bound"] = r["roof_flops_per_s"] = r["roof_time_ms"] = None
                continue
            p = _roof.place(r["flops"], r["bytes_read"] + r["bytes_written"], peaks)
            r["bound"], r["roof_flops_per_s"], r["roof_time_ms"] = (
                p.bound, p.roof_flops_per_s, p.time_s * 1e3)
        self._pct()
        return self

    def with_ort(self, profile) -> Analysis:
        """Fill ``time_ort_ms`` / ``ort_kernel`` from an :class:`~workbench.analysis.
        ort_profile.OrtProfile` (:func:`~workbench.analysis.ort_profile.profile_ort`): a
        kernel's time goes to the node with the most FLOPs among those it covers; the others
        name the kernel in ``ort_kernel``."""
        self.ort = profile
        self._fused = {}
        by_name = {r["node"]: r for r in self.records}
        for r in self.records:
            r["time_ort_ms"] = None
            r["ort_kernel"] = None
        for k in profile.kernels:
            covered = [by_name[c] for c in k.covers if c in by_name]
            if not covered:
                continue
            anchor = max(covered, key=lambda r: (r["flops"] or 0, r["bytes_read"] or 0))
            anchor["time_ort_ms"] = (anchor["time_ort_ms"] or 0.0) + k.time_ms
            if len(covered) > 1:
                self._fused[anchor["node"]] = [r["node"] for r in covered]
            for r in covered:
                r["ort_kernel"] = k.name if r["ort_kernel"] is None \
                    else f"{r['ort_kernel']}, {k.name}"
        self._pct()
        return self

    # ------------------------------------------------------------------ our engine
    def nbytes(self, name: str) -> int | None:
        """Bytes of value ``name`` as our engine holds it (elements x the numpy item size;
        an initializer's own size), None when its shape or type is unknown."""
        a = self.graph.initializers.get(name)
        if a is not None:
            return int(a.nbytes)
        s, t = self.shape_of(name), self.type_of(name)
        if s is None or not _shapes.is_known(s) or not t:
            return None
        try:
            from workbench.arrays.dtypes import np_dtype_of_onnx  # noqa: PLC0415

            item = np_dtype_of_onnx(t).itemsize
        except (TypeError, KeyError, ValueError):
            return None
        return int(math.prod(int(d) for d in s)) * int(item)

    def is_float(self, name: str) -> bool:
        """Whether value ``name`` is a float tensor (a gradient can flow through it); True
        when its type is unknown."""
        a = self.graph.initializers.get(name)
        if a is not None:
            dt = getattr(a, "dtype", None)
            return dt is None or dt.kind == "f" or dt.name == "bfloat16"
        t = self.type_of(name)
        return not t or int(t) in _FLOAT_TYPES

    def plan(self):
        """The engine's Plan of the analysed graph (built once): the schedule the memory
        timeline walks."""
        if self._plan is None:
            from .memory import plan_for  # noqa: PLC0415

            self._plan = plan_for(self.graph)
        return self._plan

    def feeds(self, seed: int = 0) -> dict:
        """Random inputs at the bound shapes (what the measurements run on)."""
        return _shapes.random_feeds(self.graph.inputs, self.input_shapes, seed)

    def trainable(self) -> set:
        """The initializers a training step differentiates: float parameters (not running
        statistics, not Constant-node weights)."""
        return {w.name for w in self.weights.values() if w.kind == "parameter"
                and w.where == "initializer" and w.name in self.graph.initializers}

    def memory(self, *, training: bool = False, measure: bool = False, feeds: dict | None = None,
               seed: int = 0):
        """The live bytes over the engine's schedule of this graph, step by step
        (:class:`~workbench.analysis.memory.MemoryTimeline`: the peak, the values that make
        it, ``plot()``); for inference it also fills the ``live_bytes_after`` column.
        ``training``: a training step (forward on the autodiff tape, loss = sum of the first
        output, backward). ``measure``: also run it under ``tracemalloc`` and put the
        measured bytes beside the prediction (``feeds``: {input: array}, random at the bound
        shapes when None). Analyse with ``optimized=True`` to see what ``backend.prepare``
        runs for inference (BatchNorm folded, fusions); train the graph as written."""
        from . import memory as _mem  # noqa: PLC0415

        plan = self.plan()
        params = self.trainable() if training else set()
        tl = _mem.predict(plan, self.nbytes, self.shape_of, training=training, params=params,
                          weights=self.graph.initializers, label=self.label,
                          is_float=self.is_float)
        if not training:
            after = tl.live_after()
            for r in self.records:
                r["live_bytes_after"] = after.get(r["node"])
            self.timeline = tl
        else:
            self.training_timeline = tl
        if measure:
            given = dict(feeds) if feeds is not None else None
            _mem.measure(tl, plan, self.graph,
                         (lambda: {k: v.copy() for k, v in given.items()}) if given else
                         (lambda: self.feeds(seed)), params=params)
        return tl

    def profile_ours(self, *, runs: int = 20, warmup: int = 3, feeds: dict | None = None,
                     seed: int = 0, engine_graph: bool = True,
                     clock: str = "wall") -> Analysis:
        """Time our engine per node (:mod:`workbench.analysis.timing`: each kernel call
        timed by a step runner, the run loop's own cost left out, medians of ``runs``
        alternated with plain runs) and fill ``time_ours_ms`` and ``pct_of_roof``.
        ``engine_graph``: time what ``backend.prepare`` runs (the optimised graph: a fused
        step's time goes on the node with the most FLOPs among those it covers, judged
        against their roofline together); False: the graph as analysed. ``clock``: "wall",
        or "cpu" (the process' CPU time, for a machine shared with other jobs; see
        :mod:`~workbench.analysis.timing`). The timings are ``self.ours`` (``describe()``:
        per-node sum vs a plain run)."""
        from workbench.runtime.plan import Plan  # noqa: PLC0415

        from .timing import time_plan  # noqa: PLC0415

        g = self.graph
        if engine_graph and not self.optimized:
            from workbench.graph import passes  # noqa: PLC0415

            g = passes.optimize(self.graph)
        plan = Plan(g)
        f = dict(feeds) if feeds is not None else self.feeds(seed)
        missing = [v.name for v in plan.input_infos if v.name not in f]
        if missing:
            raise InputError(f"profile_ours: no feed for input(s) {missing}")
        times = time_plan(plan, [f[v.name] for v in plan.input_infos], runs=runs,
                          warmup=warmup, clock=clock)
        self.ours = times
        by_name = {r["node"]: r for r in self.records}
        for r in self.records:
            r["time_ours_ms"] = None
        self._fused_ours = {}
        if g is self.graph:
            for name, ms in times.node_ms.items():
                if name in by_name:
                    by_name[name]["time_ours_ms"] = ms
        else:
            for st_name, _outs, covers in _covers(self.graph, plan, self.static):
                rows = [by_name[c] for c in covers if c in by_name]
                if not rows:
                    continue
                anchor = max(rows, key=lambda r: (r["flops"] or 0, r["bytes_read"] or 0))
                anchor["time_ours_ms"] = (anchor["time_ours_ms"] or 0.0) + \
                    times.node_ms.get(st_name, 0.0)
                if len(rows) > 1:
                    self._fused_ours.setdefault(anchor["node"], []).extend(
                        r["node"] for r in rows)
        self._pct()
        return self

    def fused(self, engine: str = "ours") -> dict:
        """{node: [the nodes whose time that node's time includes, itself among them]} for the
        steps that ran several nodes as one: our engine's fused steps (``engine="ours"``,
        after :meth:`profile_ours`) or onnxruntime's fused kernels (``"ort"``, after
        :meth:`profile_ort`). A node in no list ran alone (or, for onnxruntime, was folded
        away when ``time_ort_ms`` is None). A copy: changing it changes nothing here."""
        if engine not in ("ours", "ort"):
            raise InputError(f"fused: engine is 'ours' or 'ort', not {engine!r}")
        src = self._fused_ours if engine == "ours" else self._fused
        return {k: list(v) for k, v in src.items()}

    def overlay(self, metric: str | None = None) -> dict:
        """This analysis as a graph overlay (:func:`workbench.analysis.overlay.
        overlay_payload`): what ``GraphView.show_analysis`` shows."""
        from .overlay import overlay_payload  # noqa: PLC0415

        return overlay_payload(self, metric)

    def profile_ort(self, *, runs: int = 10, warmup: int = 2, optimization: str = "all",
                    threads: int | None = None) -> Analysis:
        """Run onnxruntime's profiler on this model at the bound shapes (random inputs) and
        fill ``time_ort_ms`` / ``ort_kernel`` (:meth:`with_ort`); the profile itself, with
        every kernel and the nodes it covers, is ``self.ort``."""
        from .ort_profile import profile_ort  # noqa: PLC0415

        model = self.proto if self.proto is not None else _as_model(self.graph, False)[0]
        prof = profile_ort(model, self.input_shapes, graph=self.graph, runs=runs,
                           warmup=warmup, optimization=optimization, threads=threads)
        return self.with_ort(prof)

    # ------------------------------------------------------------------ views
    def totals(self) -> dict:
        """Sums over the nodes that run (static nodes left out), plus counts: ``nodes``,
        ``nodes_without_flops``, ``parameters`` / ``buffers`` (every weight once) and where
        they live (``params_in_initializers``, ``params_in_constants``)."""
        run = [r for r in self.records if not r["static"]]
        out: dict = {}
        for c in SUMMED:
            vals = [r[c] for r in run if r[c] is not None]
            out[c] = sum(vals) if vals else None
        for c in ("macs", "flops", "bytes_read", "bytes_written", "activation_bytes"):
            out[c] = out[c] or 0
        out["params"] = sum(w.size for w in self.weights.values() if w.kind == "parameter")
        out["buffers"] = sum(w.size for w in self.weights.values() if w.kind == "buffer")
        out["param_bytes"] = sum(w.nbytes for w in self.weights.values())
        out["params_in_initializers"] = sum(w.size for w in self.weights.values()
                                            if w.where == "initializer")
        out["params_computed"] = sum(w.size for w in self.weights.values() if w.computed)
        out["params_in_constants"] = sum(w.size for w in self.weights.values()
                                         if w.in_constant_node)
        out["nodes"] = len(self.records)
        out["static_nodes"] = len(self.records) - len(run)
        out["nodes_without_flops"] = sum(1 for r in run if r["flops"] is None)
        moved = out["bytes_read"] + out["bytes_written"]
        out["intensity"] = out["flops"] / moved if moved else None
        return out

    def groups(self, depth: int | None = 1):
        """Sums per name scope, cut at ``depth`` levels (None: the full scope). A table like
        :meth:`table`: columns ``group``, ``nodes`` and the summed columns."""
        acc: dict = OrderedDict()
        for r in self.records:
            if r["static"]:
                continue
            parts = r["group"].split("/") if r["group"] else []
            key = "/".join(parts if depth is None else parts[:depth]) or "(top)"
            a = acc.setdefault(key, {"group": key, "nodes": 0, **dict.fromkeys(SUMMED)})
            a["nodes"] += 1
            for c in SUMMED:
                if r[c] is not None:
                    a[c] = (a[c] or 0) + r[c]
        return _frame(list(acc.values()), ("group", "nodes") + SUMMED)

    def table(self, columns=None):
        """The per-node table: a pandas DataFrame when pandas is installed, else a list of
        dicts. ``columns``: a subset (default: all of :data:`COLUMNS`)."""
        cols = tuple(columns) if columns else COLUMNS
        bad = [c for c in cols if c not in COLUMNS]
        if bad:
            raise InputError(f"unknown column(s) {bad}; the columns are {list(COLUMNS)}")
        return _frame([{c: r[c] for c in cols} for r in self.records], cols)

    def slowest(self, n: int = 10) -> list:
        """The ``n`` nodes furthest below their roof (lowest ``pct_of_roof``) that took
        measurable time: where optimisation pays."""
        timed = [r for r in self.records if r["pct_of_roof"] is not None]
        return sorted(timed, key=lambda r: r["pct_of_roof"])[:n]

    def to_csv(self, path=None, *, columns=None, overwrite: bool = False):
        """Write the per-node table as CSV to ``path`` (atomically; an existing file only with
        ``overwrite=True``), or return the text when ``path`` is None."""
        cols = tuple(columns) if columns else COLUMNS
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in self.records:
            w.writerow(["" if r[c] is None else _csv_cell(r[c]) for c in cols])
        text = buf.getvalue()
        if path is None:
            return text
        from workbench.files import write_atomic  # noqa: PLC0415

        return write_atomic(path, lambda f: f.write(text.encode("utf-8")), overwrite=overwrite)

    def to_markdown(self, columns=None, *, top: int | None = None, sort: str | None = None) -> str:
        """The per-node table as Markdown (human units), optionally the ``top`` rows by
        ``sort`` (a column name; descending)."""
        cols = tuple(columns) if columns else MARKDOWN_COLUMNS
        rows = list(self.records)
        if sort:
            if sort not in COLUMNS:
                raise InputError(f"sort: unknown column {sort!r}")
            rows.sort(key=lambda r: (r[sort] is None, -(r[sort] or 0)
                                     if isinstance(r[sort], (int, float)) else 0))
        if top:
            rows = rows[:top]
        return markdown_table(rows, cols)

    def summary(self) -> str:
        """A few lines: the shapes, the totals, where the parameters live, the notes."""
        t = self.totals()
        ins = ", ".join(f"{k}={'x'.join(str(d) for d in s)}" for k, s in self.input_shapes.items())
        lines = [f"{self.label} at {ins}",
                 f"  MACs {human(t['macs'])}, FLOPs {human(t['flops'])} "
                 f"(1 MAC = 2 FLOPs; element-wise, normalisation, pooling included)",
                 f"  parameters {t['params']:,}" + (f" + {t['buffers']:,} in buffers "
                                                    f"(running statistics)" if t["buffers"]
                                                    else "")
                 + f" ({human(t['param_bytes'], 'B')}): {t['params_in_initializers']:,} in "
                   f"initializers, {t['params_in_constants']:,} in Constant nodes"
                 + (f", {t['params_computed']:,} computed from constants at run time "
                    f"(ConstantOfShape...)" if t["params_computed"] else ""),
                 f"  activations written {human(t['activation_bytes'], 'B')}; bytes moved "
                 f"{human(t['bytes_read'] + t['bytes_written'], 'B')}; arithmetic intensity "
                 + (f"{t['intensity']:.1f} FLOP/B" if t["intensity"] else "n/a"),
                 f"  {t['nodes']} nodes ({t['static_nodes']} static: computed from constants "
                 f"only, not counted)"]
        if t["nodes_without_flops"]:
            ops = sorted({r["op"] for r in self.records
                          if r["flops"] is None and not r["static"]})
            lines.append(f"  {t['nodes_without_flops']} node(s) without a FLOP count: "
                         f"{_md_cell('op', ', '.join(ops))}")
        if self.peaks is not None:
            lines.append(f"  roofline: {self.peaks.describe()}")
            if t["roof_time_ms"] is not None:
                lines.append(f"  roofline time (the least the peaks allow): "
                             f"{t['roof_time_ms']:.3f} ms")
        if self.ort is not None:
            ks = self.ort.kernels
            fused = sum(1 for k in ks if len(k.covers) > 1)
            layout = sum(1 for k in ks if not k.covers)
            lines.append(f"  onnxruntime {self.ort.version}: {len(ks)} kernels for "
                         f"{len(self.records)} nodes ({fused} fused kernels covering several "
                         f"nodes, {layout} layout/copy kernels, {len(self.ort.uncovered)} "
                         f"nodes folded away); kernels {t['time_ort_ms'] or 0:.3f} ms, a run "
                         f"{self.ort.total_ms:.3f} ms (medians of {self.ort.runs})")
        over = [r for r in self.records if (r["pct_of_roof"] or 0) > 100]
        if over:
            lines.append(f"  note: {len(over)} node(s) ran faster than the roofline allows: their "
                         f"data fit in a cache (the memory roof is main-memory bandwidth), or "
                         f"the peaks are too low (measured on a busy machine? measure again "
                         f"when it is quiet: roofline(recalibrate=True), --recalibrate)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        t = self.totals()
        return (f"<Analysis {self.label}: {t['nodes']} nodes, {human(t['macs'], 'MACs')}, "
                f"{t['params']:,} parameters>")


MARKDOWN_COLUMNS = ("node", "op", "group", "output_shape", "macs", "flops", "params",
                    "bytes_read", "bytes_written", "intensity", "bound", "time_ours_ms",
                    "time_ort_ms", "pct_of_roof", "note")


def _covers(graph, plan, static) -> list:
    """[(step node name, its outputs, the nodes of ``graph`` it runs)] for a Plan of an
    optimised copy of ``graph``: the passes keep the names of the values a fused step
    produces, so walking back from a step's outputs through ``graph``'s producers, up to the
    values other steps produce, the inputs and the constants, gives the nodes it covers
    (Conv + BatchNormalization + Add + Relu in one FusedConv). Static nodes (folded at load)
    belong to no step. A value the channels-last layout pass renamed (``<name>__nhwc``,
    ``graph.layout``) is the analysed graph's ``<name>``; the layout's own conversions
    cover no node."""
    from workbench.graph.layout import SUFFIX  # noqa: PLC0415

    def original(v):
        return v[:-len(SUFFIX)] if v.endswith(SUFFIX) else v

    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    boundary = {v.name for v in graph.inputs} | set(graph.initializers)
    steps = []
    for st in plan.steps:
        outs = [original(o) for o in st.node.outputs if o and original(o) in producer]
        boundary.update(outs)
        steps.append((st.node.name, outs))
    owned: set = set()
    out = []
    for name, outs in steps:
        seen: list = []
        todo = list(outs)
        while todo:
            v = todo.pop()
            n = producer.get(v)
            if n is None or n.name in owned or n.name in static \
                    or (n.op_type == "Constant" and (n.domain or "") in ("", "ai.onnx")):
                continue
            owned.add(n.name)
            seen.append(n.name)
            todo.extend(x for x in n.inputs if x and x not in boundary)
        out.append((name, outs, sorted(seen, key=order.__getitem__)))
    return out


def g_opset(graph, domain: str) -> int | None:
    v = graph.opsets.get(domain or "")
    if v is None and not domain:
        v = graph.opsets.get("ai.onnx")
    return v


def _dtype_name(t) -> str | None:
    if not t:
        return None
    from workbench.arrays.dtypes import dtype_name  # noqa: PLC0415

    return dtype_name(t)


def _csv_cell(v):
    if isinstance(v, tuple):
        return "x".join(str(d) for d in v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _md_cell(c: str, v) -> str:
    if v is None:
        return ""
    if isinstance(v, tuple):
        text = "x".join(str(d) for d in v)
    elif c in ("macs", "flops", "params", "buffers"):
        text = human(v)
    elif c in ("bytes_read", "bytes_written", "activation_bytes", "param_bytes",
               "live_bytes_after"):
        text = human(v, "B")
    elif c == "roof_flops_per_s":
        text = human(v, "FLOP/s")
    elif isinstance(v, float):
        text = f"{v:.3g}"
    else:
        text = str(v)
    # a model's node names are untrusted text: keep them from breaking the table (pipes) or
    # the terminal (control characters: escape sequences, new lines)
    text = "".join(" " if ord(ch) < 32 or ord(ch) == 127 else ch for ch in text)
    return text.replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(rows, cols) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_md_cell(c, r.get(c)) for c in cols) + " |")
    return "\n".join(out)


def _frame(rows: list, cols):
    try:
        import pandas as pd  # noqa: PLC0415
    except ImportError:
        return rows
    return pd.DataFrame(rows, columns=list(cols))


__all__ = ["analyze", "Analysis", "COLUMNS", "human", "markdown_table"]
