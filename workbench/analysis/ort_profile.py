"""onnxruntime's per-kernel times, mapped onto our graph's nodes.

onnxruntime (optional: a comparison tool here, never used by the engine) runs the model with
its profiler on (``SessionOptions.enable_profiling``) and saves the graph it really ran
(``optimized_model_filepath``). After its fusions one kernel often covers several of our
nodes (Conv + BatchNormalization + Relu becomes one NCHWc ``Conv``; MatMul + Add one
``Gemm``...). The mapping, in this order:

1. the values each kernel *produces* in our graph's terms: its outputs that are values of
   our graph, else the value its name is derived from (onnxruntime names a layout-transformed
   node ``<value>_nchwc``), else the outputs of our node of the same name;
2. every kernel's produced values are boundaries; walking back from a kernel's values
   through our producers, up to the boundaries, the graph inputs and the constants, gives
   the nodes it covers (the ones whose values onnxruntime fused away);
3. our nodes no kernel covers were folded away by onnxruntime (constant folding, Identity
   elimination) or are our ``static`` nodes; kernels that cover none of ours were inserted
   by onnxruntime (layout reorders, memory copies).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field

import numpy as np
import onnx

from workbench.errors import WorkbenchError

_SUFFIXES = ("_nchwc", "_token", "_fused")


@dataclass
class OrtKernel:
    """One onnxruntime node: ``name``, ``op`` (domain::op), ``provider``, ``time_ms`` (median
    per run), ``covers`` (our node names, in graph order)."""

    name: str
    op: str
    provider: str = ""
    time_ms: float = 0.0
    covers: list = field(default_factory=list)


@dataclass
class OrtProfile:
    kernels: list
    runs: int
    total_ms: float                 # median wall time of one run (onnxruntime's "model_run")
    version: str = ""
    uncovered: list = field(default_factory=list)   # our nodes no kernel covers
    optimized_model: onnx.ModelProto | None = None

    def table(self):
        """The kernels as a table (DataFrame when pandas is there): name, op, provider,
        time_ms, the number of our nodes covered and their names."""
        rows = [{"kernel": k.name, "op": k.op, "provider": k.provider, "time_ms": k.time_ms,
                 "covers_n": len(k.covers), "covers": ", ".join(k.covers)}
                for k in self.kernels]
        try:
            import pandas as pd  # noqa: PLC0415
        except ImportError:
            return rows
        return pd.DataFrame(rows)


def profile_ort(model, feeds_or_shapes: dict, *, graph=None, runs: int = 10, warmup: int = 2,
                optimization: str = "all", threads: int | None = None,
                seed: int = 0) -> OrtProfile:
    """Profile ``model`` (path, bytes or ModelProto) in onnxruntime on the CPU.

    ``feeds_or_shapes``: {input: array} or {input: shape} (random inputs then).
    ``graph``: our Graph IR of the same model to map kernels onto (loaded when None).
    ``optimization``: onnxruntime's graph optimisation level ("disable", "basic",
    "extended", "all"). ``threads``: intra-op threads (onnxruntime's default when None).
    """
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        raise WorkbenchError("profiling with onnxruntime needs the onnxruntime package (pip "
                             "install onnxruntime)") from None
    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    if optimization not in levels:
        raise WorkbenchError(f"optimization {optimization!r}: one of {sorted(levels)}")
    proto = _proto(model)
    if graph is None:
        from workbench.graph.load import load  # noqa: PLC0415

        graph = load(proto, check=False).graph
    feeds = _feeds(proto, feeds_or_shapes, seed)
    with tempfile.TemporaryDirectory(prefix="wb-ort-") as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        so.graph_optimization_level = levels[optimization]
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.log_severity_level = 3              # no warning about the NCHWc model saved
        if threads:
            so.intra_op_num_threads = int(threads)
        try:
            sess = ort.InferenceSession(proto.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
            for _ in range(max(0, warmup) + max(1, runs)):
                sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001  (onnxruntime's own errors: say it was it)
            raise WorkbenchError(f"onnxruntime could not run the model: "
                                 f"{type(e).__name__}: {str(e)[:500]}") from None
        path = sess.end_profiling()
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        opt = None
        if os.path.exists(so.optimized_model_filepath):
            try:
                opt = onnx.load(so.optimized_model_filepath, load_external_data=False)
            except Exception:  # noqa: BLE001  (the saved graph is a help, not a need)
                opt = None
    kernels, total = parse_events(events, skip_runs=max(0, warmup))
    uncovered = map_kernels(kernels, graph, opt)
    return OrtProfile(kernels, max(1, runs), total, ort.__version__, uncovered, opt)


def _proto(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        m = onnx.ModelProto()
        m.ParseFromString(bytes(model))
        return m
    from workbench.graph.load import load  # noqa: PLC0415

    return load(model, check=False, shape_inference=False).proto


def _feeds(proto, feeds_or_shapes: dict, seed: int) -> dict:
    from workbench.arrays.dtypes import np_dtype_of_onnx  # noqa: PLC0415

    inits = {t.name for t in proto.graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        v = feeds_or_shapes.get(vi.name)
        if v is None:
            raise WorkbenchError(f"profile_ort: no value or shape for input {vi.name!r}")
        if isinstance(v, np.ndarray):
            out[vi.name] = v
            continue
        dt = np_dtype_of_onnx(vi.type.tensor_type.elem_type or 1)
        shape = tuple(int(d) for d in v)
        out[vi.name] = (rng.standard_normal(shape).astype(dt) if dt.kind == "f"
                        else np.zeros(shape, dt))
    return out


def parse_events(events, skip_runs: int = 0) -> tuple:
    """([OrtKernel] in execution order with median per-run times, median run time in ms)
    from onnxruntime's profile JSON (a list of Chrome-trace events)."""
    runs = sorted((e for e in events if e.get("cat") == "Session"
                   and e.get("name") == "model_run"), key=lambda e: e["ts"])
    runs = runs[skip_runs:] if len(runs) > skip_runs else runs
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in runs]
    per: dict = {}
    info: dict = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        k = next((i for i, (a, b) in enumerate(spans) if a <= e["ts"] <= b), None)
        if k is None:
            continue
        name = e["name"][: -len("_kernel_time")]
        args = e.get("args", {})
        per.setdefault(name, [0.0] * len(spans))[k] += e["dur"] / 1e3
        info.setdefault(name, (args.get("op_name", "?"), args.get("provider", ""),
                               int(args.get("node_index", 1 << 30)), e["ts"]))
    kernels = []
    for name, times in sorted(per.items(), key=lambda kv: info[kv[0]][3]):
        op, prov, _, _ = info[name]
        kernels.append(OrtKernel(name, op, prov.replace("ExecutionProvider", ""),
                                 float(statistics.median(times))))
    total = float(statistics.median([(b - a) / 1e3 for a, b in spans])) if spans else 0.0
    return kernels, total


def map_kernels(kernels: list, graph, optimized: onnx.ModelProto | None) -> list:
    """Fill each kernel's ``covers`` with our node names; returns our nodes no kernel
    covers (see the module docstring for the rules)."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    by_name = {n.name: n for n in graph.nodes}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    ort_nodes = {}
    if optimized is not None:
        for n in optimized.graph.node:
            ort_nodes[n.name] = n
    sources = {v.name for v in graph.inputs} | set(graph.initializers)
    produced: dict = {}
    for k in kernels:
        vals = []
        on = ort_nodes.get(k.name)
        if on is not None:
            vals = [o for o in on.output if o in producer]
            if on.domain:
                k.op = f"{on.domain}::{on.op_type}"
        if not vals:
            stem = k.name
            for suf in _SUFFIXES:
                if stem.endswith(suf):
                    stem = stem[: -len(suf)]
            if stem in producer:
                vals = [stem]
        if not vals and k.name in by_name:
            vals = [o for o in by_name[k.name].outputs if o]
        produced[k.name] = vals
    boundary = set(sources) | {v for vals in produced.values() for v in vals}
    covered: set = set()
    for k in kernels:
        seen: set = set()
        todo = list(produced[k.name])
        while todo:
            v = todo.pop()
            n = producer.get(v)
            if n is None or n.name in seen:
                continue
            seen.add(n.name)
            for x in n.inputs:
                if x and x not in boundary:
                    todo.append(x)
        k.covers = sorted(seen, key=lambda s: order.get(s, 0))
        covered |= seen
    return [n.name for n in graph.nodes if n.name not in covered]
