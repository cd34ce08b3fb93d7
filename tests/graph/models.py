"""Tiny ONNX models built with onnx.helper for the graph-layer tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir=None, name="g"):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if ir is not None:
        m.ir_version = ir
    return m


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def mlp(batch="N", opset=17):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
        helper.make_node("Identity", ["r"], ["ri"], name="ident"),
        helper.make_node("MatMul", ["ri", "w2"], ["y"], name="fc2"),
    ]
    return make_model(nodes, [vi("x", [batch, 4])], [vi("y", [batch, 3])], [w1, b1, w2],
                      opset=opset)


def conv_bn(opset=13):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    scale = rng.uniform(0.5, 2, 6).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    mean = rng.standard_normal(6).astype(np.float32)
    var = rng.uniform(0.5, 2, 6).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w, "w"), (b, "b"), (scale, "s"), (bias, "bb"), (mean, "m"), (var, "v")]]
    shape_const = helper.make_node("Constant", [], ["shp"], name="shape_const",
                                   value=numpy_helper.from_array(np.array([0, -1], np.int64)))
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"], name="bn",
                         epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Dropout", ["r"], ["d"], name="drop"),
        shape_const,
        helper.make_node("Reshape", ["d", "shp"], ["y"], name="flatten"),
    ]
    return make_model(nodes, [vi("x", ["N", 3, 5, 5])], [vi("y", ["N", 150])], inits,
                      opset=opset)


def residual_block(opset=13, act="Relu"):
    """x -> Conv(c1) -> act -> Conv(c2) -> Add(x) -> act; a third Conv whose output is read
    twice (not fusable) and a Conv -> Clip with constant bounds."""
    rng = np.random.default_rng(2)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (f(4, 4, 3, 3), "w1"), (f(4), "b1"), (f(4, 4, 3, 3), "w2"), (f(4, 4, 1, 1), "w3"),
        (f(4, 4, 1, 1), "w4"), (np.array(0.0, np.float32), "lo"),
        (np.array(0.5, np.float32), "hi")]]
    attrs = {"alpha": 0.1} if act == "LeakyRelu" else {}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node(act, ["c1"], ["a1"], name="a1", **attrs),
        helper.make_node("Conv", ["a1", "w2"], ["c2"], name="c2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"], name="add"),
        helper.make_node(act, ["s"], ["a2"], name="a2", **attrs),
        helper.make_node("Conv", ["a2", "w3"], ["c3"], name="c3"),
        helper.make_node("Relu", ["c3"], ["r3"], name="r3"),
        helper.make_node("Mul", ["c3", "r3"], ["m3"], name="m3"),   # c3 read twice
        helper.make_node("Conv", ["m3", "w4"], ["c4"], name="c4"),
        helper.make_node("Clip", ["c4", "lo", "hi"], ["y"], name="clip"),
    ]
    return make_model(nodes, [vi("x", ["N", 4, 6, 6])], [vi("y", ["N", 4, 6, 6])], inits,
                      opset=opset)
