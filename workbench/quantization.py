"""Quantized models and the CPU they run on: which integer arithmetic onnxruntime uses here,
where a model's products would saturate, and why a quantized node differs from onnxruntime.

The ONNX specification computes every 8-bit integer product exactly (32-bit sums), and so does
the engine by default. onnxruntime does too on CPUs with AVX-512 VNNI or AVX-VNNI, on ARM and
on GPUs; on x86 CPUs without VNNI (AVX2, or AVX-512 without VNNI) it multiplies uint8
activations by int8 weights with ``vpmaddubsw``, which adds two adjacent products in a 16-bit
register and saturates: the same quantized model gives different numbers on two laptops
(``workbench/ops/_integer.py`` has the arithmetic).

>>> from workbench import quantization as q                      # doctest: +SKIP
>>> q.onnxruntime_arithmetic()        # what onnxruntime does on this machine (a probe model)
<IntegerArithmetic.SATURATING_U8S8: 'saturating-u8s8'>
>>> rep = backend.prepare(m, integer_arithmetic="saturating-u8s8")   # reproduce it anywhere
>>> print(q.saturation_report(m, calibration_feeds))  # which nodes saturate, how much it costs

This module sits above the engine (it runs models through ``workbench.backend``); the engine
never imports it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import InputError, WorkbenchError
from workbench.graph import passes
from workbench.graph.ir import Graph, ValueInfo
from workbench.ops._integer import IntegerArithmetic, counting_saturation, parse_arithmetic
from workbench.runtime.plan import Plan

EXACT = IntegerArithmetic.EXACT
SATURATING_U8S8 = IntegerArithmetic.SATURATING_U8S8

#: what to do about it, as onnxruntime documents it: its quantization guide ("When and why do I
#: need to try U8U8?": reduce_range, 7-bit weights, or the U8U8 format) and its session option
#: "session.x64quantprecision" (slower U8U8 kernels on x64 CPUs without VNNI)
ADVICE = ("to avoid it, quantize with reduce_range=True (7-bit weights) or uint8 weights "
          "(U8U8; per-channel convolutions keep int8 weights), or run onnxruntime with the "
          "session option session.x64quantprecision=1")

__all__ = ["IntegerArithmetic", "EXACT", "SATURATING_U8S8", "ADVICE", "ArithmeticUnknownError",
           "classify_arithmetic", "probe_model", "PROBE_INPUT", "onnxruntime_arithmetic",
           "NodeSaturation", "SaturationReport", "saturation_report", "qdq_product_nodes",
           "onnxruntime_optimized_model", "explain_onnxruntime_difference"]


class ArithmeticUnknownError(WorkbenchError, RuntimeError):
    """onnxruntime's result on the probe is neither the exact nor the saturating one."""


# ---------------------------------------------------------------------------------- the probe
#: the probe's uint8 activations: two large values (they saturate with large weights of one
#: sign) and two small ones (they never do)
PROBE_INPUT = np.array([[255, 255, 3, 5]], dtype=np.uint8)
_PROBE_WEIGHTS = np.array([[127, -128], [127, -128], [2, 1], [1, 1]], dtype=np.int8)


def probe_model() -> onnx.ModelProto:
    """One MatMulInteger of PROBE_INPUT (uint8, the graph input "a") by constant int8 weights
    whose exact products (64781, -65272) differ from the pair-saturated ones (32778,
    -32760)."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"], name="probe")], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2])],
        [numpy_helper.from_array(_PROBE_WEIGHTS, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _probe_expectations() -> tuple[np.ndarray, np.ndarray]:
    """(exact, pair-saturated) results of the probe, computed here independently."""
    a = PROBE_INPUT.astype(np.int64)
    w = _PROBE_WEIGHTS.astype(np.int64)
    exact = a @ w
    pairs = a[:, 0::2, None] * w[None, 0::2] + a[:, 1::2, None] * w[None, 1::2]
    return exact, np.clip(pairs, -32768, 32767).sum(axis=1)


def classify_arithmetic(observed, exact, saturated) -> IntegerArithmetic:
    """Which arithmetic produced ``observed``: EXACT when it equals ``exact``, SATURATING_U8S8
    when it equals ``saturated``. The two expectations must differ (a probe that does not
    tell them apart is refused); anything else raises :class:`ArithmeticUnknownError`.

    >>> classify_arithmetic([64781], [64781], [32778])
    <IntegerArithmetic.EXACT: 'exact'>
    >>> classify_arithmetic([32778], [64781], [32778])
    <IntegerArithmetic.SATURATING_U8S8: 'saturating-u8s8'>
    """
    observed, exact, saturated = (np.asarray(v) for v in (observed, exact, saturated))
    if np.array_equal(exact, saturated):
        raise ValueError("the probe does not distinguish the arithmetics: its exact and "
                         "saturated results are equal")
    if observed.shape != exact.shape:
        raise ArithmeticUnknownError(f"the probe's result has shape {observed.shape}, "
                                     f"expected {exact.shape}")
    if np.array_equal(observed, exact):
        return EXACT
    if np.array_equal(observed, saturated):
        return SATURATING_U8S8
    raise ArithmeticUnknownError(
        f"onnxruntime computed {observed.ravel().tolist()} for the integer-product probe: "
        f"neither the exact result {exact.ravel().tolist()} nor the pair-saturated one "
        f"{saturated.ravel().tolist()}")


@functools.cache
def onnxruntime_arithmetic() -> IntegerArithmetic:
    """The integer arithmetic onnxruntime's CPU provider uses on this machine, found once per
    process by running :func:`probe_model` (a few milliseconds)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise WorkbenchError("probing onnxruntime's integer arithmetic needs the onnxruntime "
                             "package (pip install onnxruntime)") from None
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(probe_model().SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    observed = sess.run(None, {"a": PROBE_INPUT})[0]
    return classify_arithmetic(observed, *_probe_expectations())


# ---------------------------------------------------------------------------------- QDQ
_QDQ_FUSED = ("Conv", "MatMul", "Gemm")


def qdq_product_nodes(graph: Graph) -> list:
    """Float Conv / MatMul / Gemm nodes that read 8-bit activations and int8 weights through
    DequantizeLinear (the QDQ format). The engine runs them in float on the dequantized values
    (the spec); onnxruntime's graph optimizer fuses them into QLinearConv / QLinearMatMul /
    QGemm (on x86 turning int8 activations into uint8 first), whose uint8 x int8 products
    saturate like any other on x86 CPUs without VNNI."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}

    def dq_type(name):
        n = producer.get(name)
        if n is None or n.op_type != "DequantizeLinear" or not n.inputs:
            return None
        src = n.inputs[0]
        if src in graph.initializers:
            return np.asarray(graph.initializers[src]).dtype
        vi = graph.value(src)
        if vi is None or vi.dtype is None:
            return None
        return np.dtype(helper.tensor_dtype_to_np_dtype(vi.dtype))

    out = []
    for n in graph.nodes:
        if n.op_type in _QDQ_FUSED and len(n.inputs) >= 2:
            a, w = dq_type(n.inputs[0]), dq_type(n.inputs[1])
            if a in (np.dtype(np.uint8), np.dtype(np.int8)) and w == np.dtype(np.int8):
                out.append(n)
    return out


def onnxruntime_optimized_model(model) -> onnx.ModelProto:
    """``model`` (path, bytes or ModelProto) as onnxruntime's CPU provider rewrites it before
    running it (ORT_ENABLE_EXTENDED: the QDQ groups fused into integer operators, x86's int8
    activations turned into uint8), read back from the file onnxruntime saves. The engine runs
    it, and ``integer_arithmetic="saturating-u8s8"`` then reproduces what onnxruntime computes
    for a QDQ model on an x86 CPU without VNNI."""
    import tempfile
    try:
        import onnxruntime as ort
    except ImportError:
        raise WorkbenchError("onnxruntime_optimized_model needs the onnxruntime package "
                             "(pip install onnxruntime)") from None
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    with tempfile.TemporaryDirectory(prefix="wb-ort-optimized-") as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = f"{tmp}/optimized.onnx"
        so.log_severity_level = 3
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        return onnx.load(so.optimized_model_filepath)


# ---------------------------------------------------------------------------------- nodes
def _single_node_graph(graph: Graph, node, values: dict) -> tuple[Graph, dict]:
    """``node`` alone as a graph whose inputs are fed from ``values`` (initializers stay
    initializers); returns (graph, feeds)."""
    inits, ins, feeds = {}, [], {}
    for name in node.inputs:
        if not name or name in inits or name in feeds:
            continue
        if name in graph.initializers:
            inits[name] = graph.initializers[name]
        else:
            ins.append(ValueInfo(name))
            feeds[name] = values[name]
    outs = [ValueInfo(o) for o in node.outputs if o]
    g = Graph(f"node {node.name}", [node], ins, outs, inits, {}, dict(graph.opsets))
    return g, feeds


def _run_node(graph: Graph, node, values: dict, mode) -> list:
    g, feeds = _single_node_graph(graph, node, values)
    if parse_arithmetic(mode) is not EXACT:
        g = passes.set_integer_arithmetic(g, mode)
    return Plan(g, check_inputs=False).run(feeds)


def _max_change(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def explain_onnxruntime_difference(graph: Graph, node, inputs: dict, reference,
                                   *, rtol: float = 1e-5) -> str | None:
    """One line saying why ``node``'s output differs from onnxruntime's ``reference`` when the
    cause is onnxruntime's saturating u8 x s8 arithmetic: the node, run alone on ``inputs``
    (value name -> array: onnxruntime's own values of its inputs, or the engine's), gives
    ``reference`` in the saturating arithmetic and not in the exact one. None otherwise
    (another op, other types, or a difference the saturation does not explain)."""
    if not any(n is node for n in passes.integer_product_nodes(graph)):
        return None
    try:
        exact = _run_node(graph, node, inputs, EXACT)[0]
        with counting_saturation() as count:
            sat = _run_node(graph, node, inputs, SATURATING_U8S8)[0]
    except (WorkbenchError, KeyError):
        return None
    if not count.saturated:
        return None
    ref = np.asarray(reference)
    d_exact, d_sat = _max_change(exact, ref), _max_change(sat, ref)
    scale = max(float(np.max(np.abs(ref.astype(np.float64)))) if ref.size else 0.0, 1e-30)
    reproduced = d_sat <= rtol * scale or d_sat <= d_exact / 10
    if not reproduced or d_exact <= d_sat:
        return None
    return (f"{node.name} ({node.op_type}): onnxruntime on this CPU (x86 without VNNI) adds "
            f"uint8 x int8 products in pairs saturated to int16 ({count.saturated} of "
            f"{count.pairs} pairs here); the engine computes them exactly, as the ONNX spec "
            f"says. backend.prepare(m, integer_arithmetic='saturating-u8s8') reproduces "
            f"onnxruntime (max difference {d_sat:.3g}, was {d_exact:.3g}); {ADVICE}")


# ---------------------------------------------------------------------------------- report
@dataclass
class NodeSaturation:
    """One node's integer products under onnxruntime's saturating arithmetic."""

    node: str
    op_type: str
    #: pair sums computed (u8 x s8 only; other types and exact paths compute none)
    pairs: int = 0
    #: pair sums beyond int16, cut by the saturation
    saturated: int = 0
    #: dot products (accumulators) computed / with at least one cut pair
    dots: int = 0
    dots_affected: int = 0
    #: largest change of the node's first output (saturating - exact, same inputs), in the
    #: output's own units: quantization steps for an integer output
    output_change: float = 0.0
    output_dtype: str = ""

    @property
    def fraction(self) -> float:
        """Fraction of the pair sums that saturate."""
        return self.saturated / self.pairs if self.pairs else 0.0


@dataclass
class SaturationReport:
    """Where a quantized model's u8 x s8 products would saturate on x86 CPUs without VNNI
    (onnxruntime's arithmetic there), for some inputs, and what it does to the outputs."""

    nodes: list = field(default_factory=list)
    #: model output -> largest |saturating - exact| over the inputs
    output_change: dict = field(default_factory=dict)
    #: model output -> largest |exact output| (the scale of the change)
    output_scale: dict = field(default_factory=dict)
    batches: int = 0
    inputs_note: str = ""
    #: names of QDQ-format nodes onnxruntime would fuse into saturating integer operators
    qdq_nodes: list = field(default_factory=list)

    @property
    def saturating_nodes(self) -> list:
        return [n for n in self.nodes if n.saturated]

    def table(self) -> str:
        note = f": {self.inputs_note}" if self.inputs_note else ""
        lines = [f"saturation on x86 CPUs without VNNI (onnxruntime's u8 x s8 arithmetic), "
                 f"{self.batches} input batch(es){note}"]
        if self.qdq_nodes:
            lines.append(
                f"  {len(self.qdq_nodes)} QDQ node(s) ({', '.join(self.qdq_nodes[:4])}"
                f"{', ...' if len(self.qdq_nodes) > 4 else ''}) read 8-bit activations and "
                f"int8 weights: the engine runs them in float, onnxruntime fuses them into "
                f"integer operators that saturate alike; report on "
                f"quantization.onnxruntime_optimized_model(model) to see those")
        if not self.nodes:
            lines.append("  no node of the model as written computes 8-bit integer products"
                         + ("" if self.qdq_nodes else ": nothing can saturate"))
            return "\n".join(lines)
        w = max(len(n.node) for n in self.nodes)
        w = min(max(w, 4), 48)
        lines.append(f"  {'node':{w}s}  {'op':22s} {'pairs':>10s} {'saturated':>10s} "
                     f"{'share':>7s} {'dots hit':>9s}  node output change")
        for n in self.nodes:
            hit = f"{n.dots_affected / n.dots:.1%}" if n.dots else "-"
            change = "0" if not n.output_change else f"{n.output_change:.4g}" + (
                f" ({n.output_dtype})" if n.output_dtype.startswith(("uint", "int")) else "")
            lines.append(f"  {n.node[:w]:{w}s}  {n.op_type[:22]:22s} {n.pairs:10d} "
                         f"{n.saturated:10d} {n.fraction:7.2%} {hit:>9s}  {change}")
        lines.append("model outputs (saturating - exact):")
        for name, d in self.output_change.items():
            scale = self.output_scale.get(name, 0.0)
            rel = f" ({d / scale:.2%} of the output's range)" if scale else ""
            lines.append(f"  {name}: max |change| {d:.4g}{rel}")
        if self.saturating_nodes:
            lines.append(f"{len(self.saturating_nodes)} of {len(self.nodes)} integer-product "
                         f"node(s) saturate; {ADVICE}")
        else:
            lines.append("no pair sum saturates for these inputs")
        return "\n".join(lines)

    __str__ = table

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())


def _batches(graph: Graph, inputs) -> list:
    """Feeds as a list of {name: array}: one dict, one list of arrays in input order, or a
    sequence of either (several calibration batches)."""
    names = [v.name for v in graph.inputs]

    def one(x):
        if isinstance(x, dict):
            return dict(x)
        if isinstance(x, (list, tuple)) and all(isinstance(a, np.ndarray) for a in x):
            if len(x) != len(names):
                raise InputError(f"{len(x)} arrays given for the model's {len(names)} "
                                 f"inputs {names}")
            return dict(zip(names, x))
        raise InputError("inputs: give a dict {input name: array}, a list of arrays in input "
                         "order, or a list of such batches")
    if isinstance(inputs, dict) or (isinstance(inputs, (list, tuple)) and inputs
                                    and all(isinstance(a, np.ndarray) for a in inputs)):
        return [one(inputs)]
    if isinstance(inputs, np.ndarray) and len(names) == 1:
        return [{names[0]: inputs}]
    batches = [one(b) for b in inputs]
    if not batches:
        raise InputError("inputs: no calibration batch given")
    return batches


def saturation_report(model, inputs, *, inputs_note: str = "") -> SaturationReport:
    """Run ``model`` (path, bytes, ModelProto) on ``inputs`` (a feed dict, a list of arrays,
    or a list of such batches: calibration data) and report, per node that computes 8-bit
    integer products, how many uint8 x int8 pair sums onnxruntime would saturate on an x86
    CPU without VNNI, the largest change of the node's output, and the largest change of
    every model output (the whole model run both ways)."""
    from workbench.graph.load import load

    loaded = load(model)
    graph = loaded.graph
    nodes = passes.integer_product_nodes(graph)
    stats = {n.name: NodeSaturation(n.name, n.op_type) for n in nodes}
    out_names = [v.name for v in graph.outputs]
    input_names = {v.name for v in graph.inputs}
    needed = [i for n in nodes for i in n.inputs
              if i and i not in graph.initializers and i not in input_names]
    wanted = list(dict.fromkeys(out_names + needed))
    plan = Plan(graph, outputs=wanted)
    saturating = Plan(passes.set_integer_arithmetic(graph, SATURATING_U8S8))
    report = SaturationReport(nodes=list(stats.values()), inputs_note=inputs_note,
                              qdq_nodes=[n.name for n in qdq_product_nodes(graph)])
    for feeds in _batches(graph, inputs):
        values = dict(feeds)
        values.update(zip(wanted, plan.run(feeds)))
        report.batches += 1
        for n in nodes:
            st = stats[n.name]
            exact = _run_node(graph, n, values, EXACT)[0]
            with counting_saturation() as count:
                sat = _run_node(graph, n, values, SATURATING_U8S8)[0]
            st.pairs += count.pairs
            st.saturated += count.saturated
            st.dots += count.dots
            st.dots_affected += count.dots_affected
            st.output_change = max(st.output_change, _max_change(sat, exact))
            st.output_dtype = str(np.asarray(exact).dtype)
        for name, s in zip(out_names, saturating.run(feeds)):
            e = np.asarray(values[name])
            report.output_change[name] = max(report.output_change.get(name, 0.0),
                                             _max_change(s, e))
            if e.dtype.kind in "biuf" and e.size:
                report.output_scale[name] = max(report.output_scale.get(name, 0.0),
                                                float(np.max(np.abs(e.astype(np.float64)))))
    return report
