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
3. a node still uncovered whose inputs come from covered nodes is an epilogue fused into the
   kernel, among those that made its inputs, that ran last (onnxruntime's NCHWc Conv takes
   a residual Add and a Relu but keeps the name of the BatchNorm output it started from);
4. our nodes no kernel covers were folded away by onnxruntime (constant folding of shape
   arithmetic); layout kernels (``ReorderInput`` / ``ReorderOutput``, memory copies) cover
   none of ours.
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


def _epilogue_end(value: str, on, consumers: dict) -> str:
    """The value a fused convolution really ends at: onnxruntime names an NCHWc / fused Conv
    after the value it started from, while its ``Sum`` / ``Z`` input (4th) and its
    ``activation`` attribute say it also ran the following Add and activation."""
    if on.op_type not in ("Conv", "FusedConv"):
        return value
    act = next((a.s.decode() if isinstance(a.s, bytes) else a.s
                for a in on.attribute if a.name == "activation"), "")
    steps = (["Add"] if len(on.input) > 3 and on.input[3] else []) + ([act] if act else [])
    for op in steps:
        nxt = consumers.get(value, [])
        if len(nxt) == 1 and nxt[0].op_type == op and nxt[0].outputs:
            value = nxt[0].outputs[0]
    return value


def _shape_static(graph, constant_nodes: set) -> set:
    """Our nodes that only compute with shapes and constants (fixed at bound shapes)."""
    from workbench.ops import registry  # noqa: PLC0415

    static_vals = set(graph.initializers)
    static_vals |= {o for n in graph.nodes if n.name in constant_nodes for o in n.outputs}
    out = set()
    for n in graph.nodes:
        if n.name in constant_nodes or n.subgraphs:
            continue
        f = registry.facts(n.op_type, n.domain)
        ins = [x for x in n.inputs if x]
        if f.random or not ins:
            continue
        if f.shape_only or all(x in static_vals for x in ins):
            out.add(n.name)
            static_vals.update(o for o in n.outputs if o)
    return out


def _pass_views_back(kernels, ort_nodes, by_name, optimized) -> None:
    """A reshape onnxruntime inserted after a kernel (``gemm_output_reshape`` around a 3-D
    MatMul + Add turned into Gemm) hands what it covers to the kernel that fed it."""
    if optimized is None:
        return
    made_by = {o: n.name for n in optimized.graph.node for o in n.output}
    by_kernel = {k.name: k for k in kernels}
    for k in kernels:
        on = ort_nodes.get(k.name)
        if on is None or k.name in by_name or not k.covers or not on.input:
            continue
        if on.op_type not in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"):
            continue
        src = by_kernel.get(made_by.get(on.input[0], ""))
        if src is not None and not src.covers:
            src.covers, k.covers = k.covers, set()


#: kernels onnxruntime inserts that only change a tensor's layout or device
LAYOUT_OPS = ("ReorderInput", "ReorderOutput", "MemcpyToHost", "MemcpyFromHost")


def map_kernels(kernels: list, graph, optimized: onnx.ModelProto | None) -> list:
    """Fill each kernel's ``covers`` with our node names; returns our nodes no kernel
    covers (see the module docstring for the rules)."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    consumers: dict = {}
    for n in graph.nodes:
        for x in n.inputs:
            if x:
                consumers.setdefault(x, []).append(n)
    by_name = {n.name: n for n in graph.nodes}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    ort_nodes = {n.name: n for n in optimized.graph.node} if optimized is not None else {}
    constant_nodes = {n.name for n in graph.nodes
                      if n.op_type == "Constant" and (n.domain or "") in ("", "ai.onnx")}
    sources = {v.name for v in graph.inputs} | set(graph.initializers)
    sources |= {o for n in graph.nodes if n.name in constant_nodes for o in n.outputs}
    produced: dict = {}
    boundary = set(sources)
    for k in kernels:
        on = ort_nodes.get(k.name)
        outs = [o for o in on.output if o in producer] if on is not None else []
        if on is not None and on.domain:
            k.op = f"{on.domain}::{on.op_type}"
        boundary.update(outs)
        if k.op.rpartition("::")[2] in LAYOUT_OPS:
            produced[k.name] = []              # a copy in another layout: computes nothing
            continue
        vals = outs
        if not vals:
            stem = k.name
            for suf in _SUFFIXES:
                if stem.endswith(suf):
                    stem = stem[: -len(suf)]
            if stem in producer:
                vals = [stem]
        if not vals and k.name in by_name:
            vals = [o for o in by_name[k.name].outputs if o]
        if on is not None and len(vals) == 1:
            vals = [_epilogue_end(vals[0], on, consumers)]
        produced[k.name] = vals
        boundary.update(vals)
    # shape arithmetic (Shape, Size and what is computed from them and constants) is folded
    # by onnxruntime at these static shapes: not part of any kernel
    folded = _shape_static(graph, constant_nodes)
    owner: dict = {}                           # our node -> index of the kernel covering it
    for i, k in enumerate(kernels):
        seen: set = set()
        todo = list(produced[k.name])
        while todo:
            v = todo.pop()
            n = producer.get(v)
            if n is None or n.name in seen or n.name in constant_nodes or n.name in folded:
                continue
            seen.add(n.name)
            owner.setdefault(n.name, i)
            todo.extend(x for x in n.inputs if x and x not in boundary)
        k.covers = seen
    _pass_views_back(kernels, ort_nodes, by_name, optimized)
    for i, k in enumerate(kernels):
        for c in k.covers:
            owner[c] = i
    # epilogues fused into a kernel named after an earlier value (onnxruntime's NCHWc Conv
    # with a residual Add and a Relu keeps the BatchNorm output's name): a node still
    # uncovered belongs to the kernel, among those that made its inputs, that ran last
    for n in graph.nodes:
        if n.name in owner or n.name in constant_nodes or n.name in folded:
            continue
        cands = [owner[producer[x].name] for x in n.inputs
                 if x and x in producer and producer[x].name in owner]
        if cands and not all(x in sources for x in n.inputs if x):
            i = max(cands)
            owner[n.name] = i
            kernels[i].covers.add(n.name)
    for k in kernels:
        k.covers = sorted(k.covers, key=lambda s: order.get(s, 0))
    return [n.name for n in graph.nodes if n.name not in owner and n.name not in constant_nodes]
