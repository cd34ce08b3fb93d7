"""The nine ``light_*`` zoo models shipped in the onnx wheel, run by the engine.

The models (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512; opset 9, IR 3) carry no weights: every weight is a ``ConstantOfShape`` filled with
0.02, so all channels compute the same thing and the final softmax is uniform. Two tests each:

* as shipped, random input of the declared shape: ours vs onnxruntime, and vs the expected
  output shipped beside the model (``light_*_output_0.pb``);
* with deterministic random weights (each ``ConstantOfShape`` replaced by a ``Constant`` of
  random values fitted to its consumer: He-normal conv/FC weights, BatchNorm scale/var in
  [0.5, 1.5], small biases/means) and the pre-softmax logits added as a graph output, so that a
  channel-order or layout mistake cannot hide behind constant weights: ours vs onnxruntime.

Normalised max error ``max|ours - ref| / max|ref|`` <= 1e-3 on every output. Batch 1.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.helpers.compare import assert_outputs_close, ort_session, run_ort, run_workbench

pytestmark = pytest.mark.slow

TOL = 1e-3
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
    outputs = {o.name for o in src.output}
    logits = [n.input[0] for n in src.node
              if n.op_type == "Softmax" and n.output[0] in outputs and n.input[0] not in outputs]
    known = {}
    if logits:  # shape inference on the small original (weights not materialised yet)
        known = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
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
    for name in logits:
        if name in known:
            g.output.append(known[name])
        else:  # the checker wants a shape field: give an unknown-rank one
            g.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            g.output[-1].type.tensor_type.shape.SetInParent()
    return m


@pytest.fixture(scope="module")
def light_models():
    folder = light_dir()
    if not folder.is_dir():
        pytest.skip(f"the installed onnx package ships no light_* models ({folder})")
    return {name: onnx.load(str(light_path(name))) for name in LIGHT_NAMES}


@pytest.mark.parametrize("name", LIGHT_NAMES, ids=list(LIGHT_NAMES))
def test_light_model_as_shipped(light_models, name):
    model = light_models[name]
    inputs = random_inputs(model, seed=1)
    ref = run_ort(ort_session(model), inputs)
    got = run_workbench(model, inputs)
    names = [o.name for o in model.graph.output]
    assert_outputs_close(got, ref, tol=TOL, names=names, what=f"light_{name} vs onnxruntime")
    expected_pb = light_dir() / f"light_{name}_output_0.pb"
    if expected_pb.exists():  # constant weights: the shipped output does not depend on the input
        expected = numpy_helper.to_array(onnx.load_tensor(str(expected_pb)))
        assert_outputs_close(got[:1], [expected], tol=TOL, names=names[:1],
                             what=f"light_{name} vs its shipped expected output")


@pytest.mark.parametrize("name", LIGHT_NAMES, ids=list(LIGHT_NAMES))
def test_light_model_random_weights(light_models, name):
    model = with_random_weights(light_models[name], seed=2)
    inputs = random_inputs(model, seed=3)
    ref = run_ort(ort_session(model), inputs)
    assert all(np.isfinite(r).all() for r in ref), "random weights overflowed in onnxruntime"
    got = run_workbench(model, inputs)
    names = [o.name for o in model.graph.output]
    assert_outputs_close(got, ref, tol=TOL, names=names,
                         what=f"light_{name} with random weights vs onnxruntime")


def test_random_weights_are_not_degenerate(light_models):
    """The randomised model really has per-channel variation (the test above is meaningful)."""
    model = with_random_weights(light_models["squeezenet"], seed=2)
    logits = run_ort(ort_session(model), random_inputs(model, seed=3))[-1]
    assert logits.std() > 1e-3 * np.abs(logits).max()
