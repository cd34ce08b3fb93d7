"""Single-node com.microsoft models built by hand, run by onnxruntime and the workbench."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def single_node(op, inputs, attrs=None, outputs=1, out_types=None, *, domain=MS, opset=17,
                const=()):
    """A model with one node. ``inputs``: list of (name, array or None); None is an omitted
    optional input. Names in ``const`` become initializers, the rest graph inputs.
    ``out_types``: ONNX element types of the outputs (float by default)."""
    names = [n if a is not None else "" for n, a in inputs]
    outs = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, domain=domain, name=f"the_{op}", **(attrs or {}))
    g_inputs, inits, feeds = [], [], {}
    for n, a in inputs:
        if a is None:
            continue
        a = np.asarray(a)
        if n in const:
            inits.append(numpy_helper.from_array(a, n))
        else:
            g_inputs.append(helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
            feeds[n] = a
    out_types = out_types or [TensorProto.FLOAT] * outputs
    g_outputs = [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)]
    graph = helper.make_graph([node], "single", g_inputs, g_outputs, inits)
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 9
    return model, feeds


def run_ort(model, feeds):
    """onnxruntime's CPU provider, no graph optimisation, one intra-op thread: its
    DynamicQuantizeLSTM quantizes the hidden state per group of batch rows, one group per
    thread (ceil(batch / threads) rows) when batch >= 2, so its result depends on the thread
    count; with one thread each step's hidden state is quantized as one tensor, like ours."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def ort_arithmetic():
    """The integer arithmetic onnxruntime uses on this CPU (probed once per process)."""
    from workbench.quantization import onnxruntime_arithmetic

    return onnxruntime_arithmetic()


def with_output_ranks(model, ranks):
    """A copy of ``model`` whose outputs declare a rank (symbolic dims): onnx.checker wants a
    shape on every graph output; the single-node builder cannot know it in advance."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o, r in zip(m.graph.output, ranks):
        tt = o.type.tensor_type
        if not tt.HasField("shape"):
            tt.shape.SetInParent()
            for k in range(r):
                tt.shape.dim.add().dim_param = f"{o.name}_d{k}"
    return m


def run_wb(model, feeds, ranks=None, integer_arithmetic="exact"):
    from workbench import backend

    if ranks is None:
        ranks = [np.ndim(r) for r in run_ort(model, feeds)]
    model = with_output_ranks(model, ranks)
    rep = backend.prepare(model, optimize=False, integer_arithmetic=integer_arithmetic)
    return [np.asarray(o) for o in rep.run(feeds)]


def compare(model, feeds, *, rtol=1e-5, atol=1e-6, int_step=0):
    """Run both, the workbench in the integer arithmetic onnxruntime uses on this CPU (exact
    with VNNI, pair-saturating without: ``workbench.quantization``), so the comparison holds
    on either kind of CPU; integer outputs equal (or within ``int_step`` quantization steps),
    float outputs within rtol/atol. Returns (workbench outputs, onnxruntime outputs)."""
    ref = run_ort(model, feeds)
    got = run_wb(model, feeds, [r.ndim for r in ref], ort_arithmetic())
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, f"output {i}: shape {g.shape} vs onnxruntime {r.shape}"
        assert g.dtype == r.dtype, f"output {i}: dtype {g.dtype} vs onnxruntime {r.dtype}"
        if r.dtype.kind in "iub":
            d = np.abs(g.astype(np.int64) - r.astype(np.int64))
            assert d.max(initial=0) <= int_step, (
                f"output {i}: {int((d > 0).sum())} of {d.size} values differ, by up to "
                f"{d.max()} (allowed {int_step})")
        else:
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return got, ref


def q8(rng, shape, dtype=np.uint8):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def f32(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def scalar(v, dtype=np.float32):
    return np.array(v, dtype=dtype)


__all__ = ["single_node", "run_ort", "run_wb", "compare", "ort_arithmetic", "q8", "f32",
           "scalar", "MS", "TensorProto", "onnx"]
