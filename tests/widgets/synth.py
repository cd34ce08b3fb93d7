"""Synthetic models for widget tests: a small runnable MLP/CNN and a 2,500-node
transformer-like graph (for layout timing; it need not be runnable)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def mlp(d_in=8, hidden=16, classes=4, opset=17, seed=0) -> onnx.ModelProto:
    """x[N,d_in] -> MatMul -> Add -> Relu -> MatMul -> Add -> Softmax -> y."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("W1", rng.standard_normal((d_in, hidden)).astype(np.float32)),
        _init("b1", rng.standard_normal(hidden).astype(np.float32)),
        _init("W2", rng.standard_normal((hidden, classes)).astype(np.float32)),
        _init("b2", rng.standard_normal(classes).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="fc1_bias"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu1"),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"], name="fc2"),
        helper.make_node("Add", ["h4", "b2"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def cnn(channels=4, classes=3, size=8, opset=17, seed=0) -> onnx.ModelProto:
    """x[N,1,size,size] -> Conv -> Relu -> MaxPool -> Flatten -> Gemm -> y (4-D activations)."""
    rng = np.random.default_rng(seed)
    half = size // 2
    inits = [
        _init("cw", rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)),
        _init("cb", rng.standard_normal(channels).astype(np.float32)),
        _init("fw", rng.standard_normal((classes, channels * half * half)).astype(np.float32)),
        _init("fb", rng.standard_normal(classes).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Flatten", ["p1"], ["f1"], name="flatten"),
        helper.make_node("Gemm", ["f1", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def transformer_like(blocks=100, d=8, heads=2, seq=4) -> onnx.ModelProto:
    """About 25 nodes per block (attention with 3 branches, residuals, MLP): 100 blocks is
    ~2,500 nodes. Weights are tiny; the graph is valid ONNX (it can be shape-inferred)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    dh = d // heads

    def w(name, shape):
        inits.append(_init(name, rng.standard_normal(shape).astype(np.float32) * 0.1))
        return name

    inits.append(_init("shape_split", np.array([1, seq, heads, dh], np.int64)))
    inits.append(_init("shape_merge", np.array([1, seq, d], np.int64)))
    inits.append(_init("scale", np.array(np.sqrt(dh), np.float32)))
    inits.append(_init("ln_s", np.ones(d, np.float32)))
    inits.append(_init("ln_b", np.zeros(d, np.float32)))
    x = "x"
    for b in range(blocks):
        p = f"b{b}_"

        def node(op, ins, name, p=p, **kw):
            out = p + name
            nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
            return out

        ln = node("LayerNormalization", [x, "ln_s", "ln_b"], "ln1", axis=-1)
        qkv = []
        for t in "qkv":
            mm = node("MatMul", [ln, w(p + "W" + t, (d, d))], t)
            rs = node("Reshape", [mm, "shape_split"], t + "_split")
            perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
            qkv.append(node("Transpose", [rs], t + "_t", perm=perm))
        s = node("MatMul", [qkv[0], qkv[1]], "scores")
        s = node("Div", [s, "scale"], "scaled")
        s = node("Softmax", [s], "attn", axis=-1)
        o = node("MatMul", [s, qkv[2]], "ctx")
        o = node("Transpose", [o], "ctx_t", perm=[0, 2, 1, 3])
        o = node("Reshape", [o, "shape_merge"], "ctx_merge")
        o = node("MatMul", [o, w(p + "Wo", (d, d))], "proj")
        x1 = node("Add", [x, o], "res1")
        ln2 = node("LayerNormalization", [x1, "ln_s", "ln_b"], "ln2", axis=-1)
        h = node("MatMul", [ln2, w(p + "W1", (d, 2 * d))], "fc1")
        h = node("Add", [h, w(p + "b1", (2 * d,))], "fc1_bias")
        h = node("Relu", [h], "act")
        h = node("MatMul", [h, w(p + "W2", (2 * d, d))], "fc2")
        h = node("Add", [h, w(p + "b2", (d,))], "fc2_bias")
        x = node("Add", [x1, h], "res2")
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    g = helper.make_graph(
        nodes, "transformer_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def chain(n=2500) -> onnx.ModelProto:
    nodes = []
    prev = "x"
    for i in range(n):
        op = ("Relu", "Sigmoid", "Tanh", "Abs")[i % 4]
        nodes.append(helper.make_node(op, [prev], [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def custom_op_model() -> onnx.ModelProto:
    """x -> Relu -> com.example::Mystery -> Relu -> y, plus a Sigmoid branch from x to z.
    The engine has no kernel for Mystery."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
        helper.make_node("Mystery", ["a"], ["b"], name="mystery", domain="com.example"),
        helper.make_node("Relu", ["b"], ["y"], name="relu_y"),
        helper.make_node("Sigmoid", ["x"], ["z"], name="sig_z"),
    ]
    g = helper.make_graph(
        nodes, "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    return m
