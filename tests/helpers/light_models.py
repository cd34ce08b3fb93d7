"""The ``light_*`` zoo models shipped in the onnx wheel: paths, inputs, random weights.

The nine models (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet,
VGG-19, ZFNet-512; opset 9, IR 3) carry no weights: every weight is a ``ConstantOfShape`` filled
with 0.02, so all channels compute the same thing and the final softmax is uniform.
:func:`with_random_weights` gives them deterministic random weights; :func:`with_dynamic_batch`
makes the batch axis symbolic (their Reshape targets hard-code batch 1).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT_NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
               "shufflenet", "squeezenet", "vgg19", "zfnet512")


def light_dir() -> Path:
    """Folder of the ``light_*`` models inside the installed onnx package."""
    return Path(str(importlib.resources.files("onnx"))) / "backend" / "test" / "data" / "light"


def light_path(name: str) -> Path:
    return light_dir() / f"light_{name}.onnx"


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (IR 3 lists initializers as inputs too)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def random_inputs(model: onnx.ModelProto, seed: int = 0, batch: int | None = None):
    """Random inputs of the declared shapes and dtypes (symbolic dims -> ``batch`` or 1)."""
    rng = np.random.default_rng(seed)
    out = []
    for vi in graph_inputs(model):
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (batch or 1) for d in tt.shape.dim]
        if batch is not None and shape:
            shape[0] = batch
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list] = {}
    for n in graph.node:
        for i, name in enumerate(n.input):
            uses.setdefault(name, []).append((n, i))
    return uses


_PASS_THROUGH = ("Unsqueeze", "Identity", "Reshape")


def _random_weight(shape, fill, uses, rng) -> np.ndarray:
    """Random values for a weight whose consumers are ``uses`` ((node, input index) pairs)."""
    node, idx = uses[0] if uses else (None, -1)
    op = node.op_type if node is not None else ""
    size = int(np.prod(shape)) if shape else 1
    if op == "Conv" and idx == 1:
        fan_in = int(np.prod(shape[1:]))
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    if op == "Gemm" and idx == 1:
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        fan_in = shape[1] if trans_b else shape[0]
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    if op == "BatchNormalization" and idx == 1:  # gamma < 1 keeps residual sums in range
        return rng.uniform(0.2, 0.6, shape)
    if op == "BatchNormalization" and idx == 4:
        return rng.uniform(0.5, 1.5, shape)
    if op == "Mul":
        return rng.uniform(0.5, 1.5, shape)
    if op in ("Conv", "Gemm", "BatchNormalization", "Add", "Sum") and size > 1:
        return rng.standard_normal(shape) * 0.1
    return np.full(shape, fill)


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of a light_* model whose ConstantOfShape weights are deterministic random values.

    Each replaced weight becomes an initializer (listed as a graph input too, as IR 3 wants).
    The input of the final Softmax (the logits) is added as an extra graph output.
    """
    rng = np.random.default_rng(seed)
    src = model.graph
    logits, known = _logits_infos(model)
    shapes = {t.name: numpy_helper.to_array(t) for t in src.initializer
              if t.data_type == onnx.TensorProto.INT64 and len(t.dims) == 1}
    uses = _consumers(src)

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    keep = []
    for n in g.node:
        if not (n.op_type == "ConstantOfShape" and n.input[0] in shapes):
            keep.append(n)
            continue
        shape = [int(v) for v in shapes[n.input[0]]]
        value = next((numpy_helper.to_array(a.t) for a in n.attribute if a.name == "value"),
                     np.zeros(1, np.float32))
        u, seen_as = uses.get(n.output[0], []), shape
        # follow a single-consumer chain of layout-only ops to the op that really uses it
        while len(u) == 1 and u[0][1] == 0 and u[0][0].op_type in _PASS_THROUGH:
            step = u[0][0]
            if step.op_type == "Reshape" and step.input[1] in shapes:
                target = [int(v) for v in shapes[step.input[1]]]
                seen_as = target if all(v > 0 for v in target) else seen_as
            u = uses.get(step.output[0], [])
        data = _random_weight(seen_as, value.reshape(-1)[0], u, rng).reshape(shape)
        data = np.ascontiguousarray(data.astype(value.dtype, copy=False))
        t = g.initializer.add()  # filled in place: one copy of the bytes, not three
        t.name = n.output[0]
        t.data_type = helper.np_dtype_to_tensor_dtype(data.dtype)
        t.dims.extend(shape)
        t.raw_data = data.tobytes()
        g.input.append(helper.make_tensor_value_info(t.name, t.data_type, shape))
    del g.node[:]
    g.node.extend(keep)
    _append_outputs(g, logits, known)
    return m


def logits_names(model: onnx.ModelProto) -> list[str]:
    """The inputs of the Softmax nodes that produce graph outputs (the models' logits)."""
    outputs = {o.name for o in model.graph.output}
    return [n.input[0] for n in model.graph.node
            if n.op_type == "Softmax" and n.output[0] in outputs and n.input[0] not in outputs]


def _logits_infos(model: onnx.ModelProto):
    logits = logits_names(model)
    known = {}
    if logits:  # shape inference on the small original (weights not materialised yet)
        known = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
    return logits, known


def _append_outputs(g: onnx.GraphProto, names, known) -> None:
    for name in names:
        if name in known:
            g.output.append(known[name])
        else:  # the checker wants a shape field: give an unknown-rank one
            g.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            g.output[-1].type.tensor_type.shape.SetInParent()


def with_logits_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with the input of its final Softmax (the logits) as an extra output."""
    logits, known = _logits_infos(model)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _append_outputs(m.graph, logits, known)
    return m


def with_dynamic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose graph inputs/outputs have a symbolic batch axis ``N``.

    The light models' Reshape targets are constants like ``[1, 1024]``: their leading 1 becomes
    0 ("copy this dimension from the input", valid since Reshape-5) so that any batch size works.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name for t in g.initializer}
    for vi in list(g.input) + list(g.output):
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = "N"
    targets = {n.input[1] for n in g.node if n.op_type == "Reshape" and len(n.input) > 1}
    for t in g.initializer:
        if t.name in targets:
            shape = numpy_helper.to_array(t).copy()
            if shape.size and shape[0] == 1:
                shape[0] = 0
                t.CopyFrom(numpy_helper.from_array(shape, t.name))
    del g.value_info[:]  # stale shapes with batch 1
    return m
