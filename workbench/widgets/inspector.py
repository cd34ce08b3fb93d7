"""TensorInspector: run a model once and look at every intermediate tensor.

>>> insp = TensorInspector("model.onnx", {"x": x})         # doctest: +SKIP
>>> insp                     # sortable table; click a row for histogram + feature maps
>>> insp.row("relu1")        # stats of a node's (first) output, by node or value name
>>> insp.array("h3")         # the full array (kept within ``keep_bytes``, else recomputed)

Statistics (min/max/mean/std, NaN/Inf counts, a histogram) are computed in Python for every
node's outputs while the engine runs (``Plan.run(..., hook=...)``); only those numbers go to the
browser. Full arrays are kept for the nodes named in ``keep`` and, beyond that, only up to
``keep_bytes``. Feature maps of 4-D activations are downsampled and sent as one binary buffer
with their dtype kept. ``compare="onnxruntime"`` runs a copy of the model with every
intermediate as an output in onnxruntime and records the max abs difference per value.
Nodes the engine cannot run are listed (``unsupported``); the rest of the graph still runs.
"""

from __future__ import annotations

import math
import time

import numpy as np
import onnx

from workbench.divergence import capture, compare_arrays, first_divergence, to_numpy
from workbench.errors import UnsupportedOperatorError, WorkbenchError
from workbench.graph.toposort import topological_order
from workbench.runtime.plan import Plan
from workbench.widgets._base import TextRepr, esm, import_widgets
from workbench.widgets._model import as_source, dtype_str, fmt_shape

anywidget, ipywidgets, traitlets = import_widgets()

HIST_BINS = 40
HIST_SAMPLE = 2_000_000      # histogram from an even subsample above this many elements
FMAP_CHANNELS = 32
FMAP_SIZE = 40


def _num(v):
    """A JSON-safe float (NaN/Inf become None)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _short(v):
    return None if v is None else float(f"{v:.7g}")


def tensor_stats(a, bins: int = HIST_BINS) -> dict:
    """Summary statistics of an array, computed without copying it more than needed."""
    if isinstance(a, (list, tuple)):
        return {"shape": f"sequence of {len(a)}", "dtype": "sequence", "size": len(a),
                "kind": "sequence"}
    if a is None:
        return {"shape": "—", "dtype": "none", "size": 0, "kind": "none"}
    a = to_numpy(a)
    out = {"shape": fmt_shape(a.shape), "dims": list(a.shape), "dtype": str(a.dtype),
           "size": int(a.size), "nbytes": int(a.nbytes), "kind": "tensor"}
    if a.size == 0 or a.dtype.kind not in "biufc":
        out.update(min=None, max=None, mean=None, std=None, nan=0, inf=0)
        return out
    if a.dtype.kind == "c":
        a = np.abs(a)
    if a.dtype.kind == "b":
        a = a.view(np.uint8)
    nan = inf = 0
    finite = a
    if a.dtype.kind == "f":
        nan = int(np.count_nonzero(np.isnan(a)))
        inf = int(np.count_nonzero(np.isinf(a)))
        if nan or inf:
            finite = a[np.isfinite(a)]
    out["nan"], out["inf"] = nan, inf
    if finite.size == 0:
        out.update(min=None, max=None, mean=None, std=None)
        out["hist"] = {"counts": [], "edges": []}
        return out
    lo, hi = finite.min(), finite.max()
    out["min"], out["max"] = _num(lo), _num(hi)
    out["mean"] = _num(finite.mean(dtype=np.float64))
    out["std"] = _num(finite.std(dtype=np.float64))
    sample = finite.ravel()
    if sample.size > HIST_SAMPLE:
        sample = sample[:: int(math.ceil(sample.size / HIST_SAMPLE))]
        out["hist_sampled"] = True
    lo_f, hi_f = float(lo), float(hi)
    if lo_f == hi_f:
        lo_f, hi_f = lo_f - 0.5, hi_f + 0.5
    counts, edges = np.histogram(sample.astype(np.float64, copy=False), bins=bins,
                                 range=(lo_f, hi_f))
    out["hist"] = {"counts": counts.astype(int).tolist(), "edges": [float(e) for e in edges]}
    return out


def feature_maps(a, channels: int = FMAP_CHANNELS, size: int = FMAP_SIZE):
    """Downsampled maps of item 0 of a 4-D [N, C, H, W] array: (array [c, h, w], info)."""
    a = to_numpy(a)
    if a.ndim != 4 or a.size == 0 or a.dtype.kind not in "biuf":
        return None, {}
    x = a[0, :channels]
    h, w = x.shape[1], x.shape[2]
    sh, sw = max(1, math.ceil(h / size)), max(1, math.ceil(w / size))
    if sh > 1 or sw > 1:
        hh, ww = (h // sh) * sh, (w // sw) * sw
        if hh and ww:
            x = x[:, :hh, :ww].reshape(x.shape[0], hh // sh, sh, ww // sw, sw)
            x = x.mean(axis=(2, 4), dtype=np.float64).astype(a.dtype if a.dtype.kind == "f"
                                                              else np.float32)
        else:
            x = x[:, ::sh, ::sw]
    x = np.ascontiguousarray(x)
    info = {"dtype": str(x.dtype), "shape": list(x.shape), "channels_total": int(a.shape[1]),
            "source_shape": list(a.shape), "stride": [sh, sw]}
    return x, info


class TensorInspector(TextRepr, anywidget.AnyWidget):
    """Per-node output statistics of one run, a sortable table, histograms, feature maps.

    Parameters: ``model`` (path/ModelProto/LoadedModel/Model/Graph), ``inputs`` (list in input
    order or dict by name), ``nodes`` (restrict statistics to these node names), ``keep``
    (node/value names whose full arrays are kept), ``keep_bytes`` (budget for other full
    arrays, default 32 MiB), ``compare`` (None or "onnxruntime"), ``rtol``/``atol``,
    ``device`` (e.g. "CUDA:0": run there; statistics are computed on the host).
    """

    _esm = esm("graph_core.js", "tensor_inspector.js")

    title = traitlets.Unicode("").tag(sync=True)
    rows = traitlets.List().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    hist = traitlets.Dict().tag(sync=True)
    fmaps = traitlets.Bytes(b"").tag(sync=True)
    fmap_info = traitlets.Dict().tag(sync=True)
    unsupported = traitlets.List().tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    compare_info = traitlets.Dict().tag(sync=True)
    first_diverging = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(460).tag(sync=True)

    def __init__(self, model, inputs, *, nodes=None, keep=None, keep_bytes: int = 32 << 20,
                 compare: str | None = None, rtol: float = 1e-3, atol: float = 1e-4,
                 device=None, height: int = 460, **kwargs):
        super().__init__(height=height, **kwargs)
        src = as_source(model)
        self.source = src
        self.graph = src.graph
        self.title = src.name
        self._device = device
        self._feeds = inputs
        if device is not None:          # feeds go to the device once; stats come back small
            from workbench.device import get_device
            dev = get_device(device)
            put = dev.put
            self._feeds = ({k: put(v) for k, v in inputs.items()} if isinstance(inputs, dict)
                           else [put(v) for v in inputs])
        self._only = set(nodes) if nodes is not None else None
        self._keep = set(keep or ())
        self.keep_bytes = int(keep_bytes)
        self.rtol, self.atol = rtol, atol
        self._arrays: dict = {}
        self._kept_bytes = 0
        self._stats: dict = {}
        self._ref: dict = {}
        self.run_seconds = None
        self._run(compare)

    # ------------------------------------------------------------------ running
    def _run(self, compare) -> None:
        g = self.graph
        order = topological_order(g)
        self._order = order
        blocked: set = set()
        unsupported = []
        plan = None
        try:
            plan = self._plan()
        except UnsupportedOperatorError as e:
            errs = getattr(e, "missing", None) or [e]
            bad = {x.node_name for x in errs}
            unsupported = [{"node": x.node_name, "op": x.op_type, "domain": x.domain,
                            "reason": str(x)} for x in errs]
            blocked = self._downstream(bad)
            runnable = [n for n in order if n.name not in blocked]
            read = {i for n in runnable for i in n.inputs if i}
            sinks = [o for n in runnable for o in n.outputs if o and o not in read]
            sinks += [o for n in runnable for o in n.outputs
                      if o and o in read and any(c.name in blocked
                                                 for c in self._consumers().get(o, ()))]
            sinks = list(dict.fromkeys(sinks))
            try:
                plan = self._plan(sinks) if sinks else None
            except WorkbenchError as e2:
                self.error = f"could not plan the runnable part: {e2}"
                plan = None
        except WorkbenchError as e:
            self.error = str(e)
        self.unsupported = unsupported
        self._blocked = blocked
        if compare:
            self._reference(compare)
        failed = None
        self._sources = set(self.graph.initializers) | {v.name for v in self.graph.inputs}
        if plan is not None:
            t0 = time.perf_counter()
            # the shared per-node capture (workbench.divergence), streaming: statistics and
            # the comparison per value as it is computed, full arrays only as kept below
            cap = capture(plan, self._feeds, keep=False, on_value=self._on_value,
                          raise_errors=False)
            failed = cap.failed
            if cap.error:
                self.error = cap.error
            self.run_seconds = time.perf_counter() - t0
        self._build_rows(order, failed)

    def _plan(self, outputs=None) -> Plan:
        kw = {"device": self._device} if self._device is not None else {}
        return Plan(self.graph, outputs=outputs, **kw)

    def _consumers(self) -> dict:
        if not hasattr(self, "_cons"):
            self._cons = self.graph.consumers()
        return self._cons

    def _downstream(self, names: set) -> set:
        out = set(names)
        prod = self.graph.producers()
        for n in self._order:
            if n.name in out:
                continue
            ins = [i for i in n.inputs if i]
            if any(prod.get(i) is not None and prod[i].name in out for i in ins):
                out.add(n.name)
        return out

    def _on_value(self, node, name, value) -> None:
        if self._only is not None and node.name not in self._only:
            return
        st = tensor_stats(value)
        ref = self._ref.get(name)
        if ref is not None and st.get("kind") == "tensor":
            st.update(self._diff(value, ref))
        self._stats[name] = st
        if st.get("kind") == "tensor":
            nb = st["nbytes"]
            if name in self._keep or node.name in self._keep:
                self._arrays[name] = np.array(value, copy=True)
            elif self._kept_bytes + nb <= self.keep_bytes:
                self._arrays[name] = np.array(value, copy=True)
                self._kept_bytes += nb

    def _diff(self, a: np.ndarray, ref: np.ndarray) -> dict:
        return compare_arrays(a, ref, rtol=self.rtol, atol=self.atol,
                              ref_name="onnxruntime").to_dict()

    def _matches(self, name: str) -> bool | None:
        st = self._stats.get(name)
        return st["diff_ok"] if st is not None and "diff" in st else None

    def _reference(self, compare: str) -> None:
        if compare != "onnxruntime":
            raise ValueError(f"compare={compare!r}: only 'onnxruntime' is supported")
        try:
            import onnxruntime as ort
        except ImportError:
            self.compare_info = {"error": "onnxruntime is not installed"}
            return
        try:
            proto = self._all_outputs_proto()
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.log_severity_level = 3
            sess = ort.InferenceSession(proto.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            feeds = self._feeds
            if not isinstance(feeds, dict):
                feeds = {v.name: x for v, x in zip(self.graph.inputs, feeds)}
            feeds = {k: to_numpy(v) for k, v in feeds.items()}
            res = sess.run(names, feeds)
            self._ref = {n: r for n, r in zip(names, res) if isinstance(r, np.ndarray)}
            self.compare_info = {"engine": f"onnxruntime {ort.__version__}",
                                 "values": len(self._ref)}
        except Exception as e:
            msg = str(e).strip().splitlines()
            self.compare_info = {"error": f"onnxruntime could not run the model: "
                                          f"{type(e).__name__}: {' '.join(msg[:3])[:400]}"}

    def _all_outputs_proto(self) -> onnx.ModelProto:
        if self.source.proto is not None:
            m = onnx.ModelProto()
            m.CopyFrom(self.source.proto)
        else:
            opsets = [onnx.helper.make_opsetid(d, v) for d, v in self.graph.opsets.items()]
            m = onnx.helper.make_model(self.graph.to_proto(), opset_imports=opsets)
            m.ir_version = 8
        have = {o.name for o in m.graph.output}
        vinfo = {v.name: v for v in m.graph.value_info}
        for n in m.graph.node:
            for o in n.output:
                if o and o not in have:
                    have.add(o)
                    if o in vinfo:
                        m.graph.output.append(vinfo[o])
                    else:
                        m.graph.output.append(onnx.ValueInfoProto(name=o))
        return m

    def _build_rows(self, order, failed) -> None:
        rows = []
        reason = {u["node"]: u["reason"] for u in self.unsupported}
        after_fail = False
        for n in order:
            if self._only is not None and n.name not in self._only:
                continue
            if failed and n.name == failed:
                status = "error"
                after_fail = True
            elif n.name in reason:
                status = "unsupported"
            elif n.name in self._blocked:
                status = "not run"
            else:
                status = "ok"
            for o in n.outputs:
                if not o:
                    continue
                st = self._stats.get(o)
                row = {"node": n.name, "op": n.op_type, "value": o, "status": status}
                if st is None:
                    vi = self.graph.value(o)
                    row.update(shape=fmt_shape(vi.shape if vi else None),
                               dtype=dtype_str(vi.dtype if vi else None))
                    if status == "ok":
                        row["status"] = "not run" if (after_fail or self.error) else "skipped"
                else:
                    row.update({k: st.get(k) for k in ("shape", "dtype", "nan", "inf")})
                    # 7 significant digits keep the table JSON small (full values: stats())
                    row.update({k: _short(st.get(k)) for k in ("min", "max", "mean", "std")})
                    if "diff" in st:
                        row["diff"] = _short(st["diff"])
                        row["diff_ok"] = st["diff_ok"]
                        if not st["diff_ok"] and o == n.outputs[0]:
                            note = self._explain(n)
                            if note:
                                row["note"] = note
                rows.append(row)
        self.rows = rows
        # the first node whose output differs, with whether its inputs matched
        # (workbench.divergence: the same criterion as the classroom's model checks)
        self.divergence = first_divergence(
            (n for n in order if self._only is None or n.name in self._only), self._matches,
            sources=self._sources)
        self.first_diverging = self.divergence.value if self.divergence else ""

    def _explain(self, node) -> str | None:
        """One line on why a quantized node differs from onnxruntime, when it is onnxruntime's
        saturating u8 x s8 arithmetic on this CPU (workbench.quantization), else None."""
        from workbench.quantization import explain_onnxruntime_difference
        feeds = self._feeds
        if not isinstance(feeds, dict):
            feeds = {v.name: x for v, x in zip(self.graph.inputs, feeds)}
        values = {k: to_numpy(v) for k, v in feeds.items()}
        values.update(self._ref)        # onnxruntime's own inputs of the node
        try:
            return explain_onnxruntime_difference(self.graph, node, values,
                                                  self._ref[node.outputs[0]])
        except Exception:  # never let the explanation break the inspector
            return None

    @property
    def notes(self) -> list:
        """The explanations found for differing values (one line each)."""
        return [r["note"] for r in self.rows if r.get("note")]

    # ------------------------------------------------------------------ selection
    @traitlets.observe("selected")
    def _on_selected(self, change) -> None:
        name = self._value_name(change["new"])
        st = self._stats.get(name) if name else None
        if not st:
            self.hist, self.fmap_info, self.fmaps = {}, {}, b""
            return
        self.hist = dict(st.get("hist") or {}, value=name, sampled=bool(st.get("hist_sampled")))
        maps, info = (None, {})
        if len(st.get("dims") or ()) == 4:
            arr = self.array(name)
            if arr is not None:
                maps, info = feature_maps(arr)
        if maps is not None:
            info["value"] = name
            self.fmap_info = info
            self.fmaps = maps.tobytes()
        else:
            self.fmap_info, self.fmaps = {}, b""

    def _value_name(self, name: str) -> str:
        if not name or name in self._stats:
            return name
        node = self.graph.node_by_name(name)
        if node is not None:
            for o in node.outputs:
                if o:
                    return o
        return name

    # ------------------------------------------------------------------ python API
    def row(self, name: str) -> dict:
        """The table row of a value (or a node's first output) by name."""
        name = self._value_name(name)
        for r in self.rows:
            if r["value"] == name:
                return r
        raise KeyError(f"no value or node named {name!r} in the inspected run")

    def stats(self, name: str) -> dict:
        """All statistics of a value (including the histogram)."""
        return self._stats[self._value_name(name)]

    def array(self, name: str):
        """The full array of a value: kept from the run, or recomputed by running the graph
        up to that value (returns None when it cannot be computed)."""
        name = self._value_name(name)
        if name in self._arrays:
            return self._arrays[name]
        if name not in self._stats:
            return None
        try:
            out, = self._plan([name]).run(self._feeds)
        except WorkbenchError:
            return None
        return to_numpy(out)

    @property
    def kept(self) -> list:
        """Names of the values whose full arrays are held."""
        return list(self._arrays)

    def table(self, sort: str | None = None, descending: bool = True, limit: int = 50) -> str:
        """The table as text (``sort`` by a column name such as "std" or "diff")."""
        rows = list(self.rows)
        if sort:
            rows.sort(key=lambda r: (r.get(sort) is None, r.get(sort) or 0), reverse=False)
            if descending:
                rows = [r for r in rows if r.get(sort) is not None][::-1] + \
                       [r for r in rows if r.get(sort) is None]
        cols = ["node", "op", "shape", "dtype", "min", "max", "mean", "std", "nan", "inf"]
        if any("diff" in r for r in rows):
            cols.append("diff")
        cols.append("status")

        def fmt(v):
            if v is None:
                return "—"
            if isinstance(v, float):
                return f"{v:.4g}"
            return str(v)
        body = [[fmt(r.get(c)) for c in cols] for r in rows[:limit]]
        widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(cols)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
        if len(rows) > limit:
            lines.append(f"… {len(rows) - limit} more rows")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def summary(self) -> str:
        ok = sum(r["status"] == "ok" for r in self.rows)
        parts = [f"TensorInspector({self.title!r}: {ok}/{len(self.rows)} values inspected"]
        bad = [r for r in self.rows if (r.get("nan") or r.get("inf"))]
        if bad:
            parts.append(f"{len(bad)} with NaN/Inf (first {bad[0]['value']!r})")
        if self.unsupported:
            ops = sorted({u["op"] for u in self.unsupported})
            names = ", ".join(u["node"] for u in self.unsupported[:5])
            parts.append(f"{len(self.unsupported)} node(s) the engine cannot run "
                         f"({', '.join(ops)}): {names}")
        if self.error:
            parts.append(f"error: {self.error[:200]}")
        if self.compare_info.get("error"):
            parts.append(self.compare_info["error"][:200])
        elif self.compare_info:
            parts.append(f"vs {self.compare_info.get('engine')}: first diverging "
                         f"{self.first_diverging or 'none'}")
            if self.notes:
                parts.append(self.notes[0])
        return "; ".join(parts) + ")"
