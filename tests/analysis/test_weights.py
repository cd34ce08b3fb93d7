"""Parameters in initializers and in Constant nodes, buffers, shared weights, non-weights;
``workbench info`` on a model whose weights all sit in Constant nodes (PaddleOCR style)."""

from __future__ import annotations

import io

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from workbench.analysis import analyze, find_weights, weight_summary
from workbench.cli import describe
from workbench.graph.load import load

F = TensorProto.FLOAT


def _const(name, a):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a, name),
                            name=f"const_{name}")


def _paddle_style():
    """conv -> bn -> relu -> matmul, every weight a Constant node (as paddle2onnx writes),
    one weight shared by two MatMuls, plus a scalar, an int64 shape and a bool mask."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    mean, var = np.zeros(4, np.float32), np.ones(4, np.float32)
    fc = rng.standard_normal((4, 4)).astype(np.float32)
    nodes = [_const("w", w), _const("g", g), _const("b", b), _const("mean", mean),
             _const("var", var), _const("fc", fc),
             _const("half", np.array(0.5, np.float32)),
             _const("shape", np.array([1, 4, -1], np.int64)),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "g", "b", "mean", "var"], ["n"],
                              name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
             helper.make_node("Transpose", ["flat"], ["t"], perm=[0, 2, 1], name="tr"),
             helper.make_node("MatMul", ["t", "fc"], ["m1"], name="fc1"),
             helper.make_node("MatMul", ["m1", "fc"], ["m2"], name="fc2"),   # shared weight
             helper.make_node("Mul", ["m2", "half"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "paddle", [helper.make_tensor_value_info("x", F,
                                                                              [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", F, [1, 64, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constant_held_weights_are_parameters_counted_once():
    m = _paddle_style()
    ws = find_weights(load(m).graph)
    assert set(ws) == {"w", "g", "b", "mean", "var", "fc"}     # no scalar, no int64 shape
    assert ws["mean"].kind == ws["var"].kind == "buffer"
    assert ws["w"].kind == "parameter" and ws["w"].in_constant_node
    assert ws["fc"].readers == ["fc1", "fc2"] and ws["fc"].owner == "fc1"
    s = weight_summary(load(m).graph)
    assert s["parameters"] == 108 + 4 + 4 + 16
    assert s["buffers"] == 8
    assert s["in_constants"] == 108 + 16 + 16 and s["n_constants"] == 6
    a = analyze(m, {})
    rows = {r["node"]: r for r in a.records}
    assert "const_w" not in rows                           # Constant nodes are not rows
    assert rows["conv"]["params"] == 108
    assert rows["bn"]["params"] == 8 and rows["bn"]["buffers"] == 8
    assert rows["fc1"]["params"] == 16 and rows["fc2"]["params"] == 0   # shared: once
    assert a.totals()["params_in_constants"] == a.totals()["params"] + 8
    assert "in Constant nodes" in a.summary()


def test_info_counts_constant_held_weights():
    out = io.StringIO()
    facts = describe(load(_paddle_style()), out)
    text = out.getvalue()
    assert facts["parameters"] == 132
    assert "parameters: 132 + 8 in buffers (running statistics): 0 in 0 initializer(s), " \
           "140 in 6 Constant node(s)" in text, text


def test_weight_preparation_chain_attributes_to_the_layer():
    """A float16 weight behind a Cast (and a Transpose) belongs to the MatMul that reads the
    prepared value, and is counted in its stored type's bytes."""
    w = np.ones((5, 6), np.float16)
    nodes = [helper.make_node("Cast", ["w16"], ["w32"], to=F, name="cast"),
             helper.make_node("Transpose", ["w32"], ["wt"], name="tr"),
             helper.make_node("MatMul", ["x", "wt"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 6])],
                          [helper.make_tensor_value_info("y", F, [2, 5])],
                          [numpy_helper.from_array(w, "w16")])
    a = analyze(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), {})
    rows = {r["node"]: r for r in a.records}
    assert rows["cast"]["static"] and rows["tr"]["static"]
    assert rows["mm"]["params"] == 30 and rows["mm"]["param_bytes"] == 60
    assert a.totals()["flops"] == 2 * 2 * 5 * 6     # static nodes are not counted
    assert rows["mm"]["macs"] == 60


def test_default_model_info_unchanged():
    from workbench.cli import default_model_path

    out = io.StringIO()
    describe(load(default_model_path()), out)
    assert "parameters: 14,378" in out.getvalue()
    m = onnx.load(default_model_path())
    assert analyze(m, default_dim=1).totals()["params"] == 14378


def test_weights_computed_from_constants_count_once():
    """A weight made by ConstantOfShape from a stored shape is a parameter (onnx's light
    models write every weight so); a float weight dequantized from stored int8 counts once,
    as the int8 tensor."""
    shape = np.array([4, 3], np.int64)
    q = np.ones((3, 4), np.int8)
    nodes = [helper.make_node("ConstantOfShape", ["wshape"], ["w"], name="gen",
                              value=numpy_helper.from_array(np.array([0.1], np.float32))),
             helper.make_node("DequantizeLinear", ["q", "s"], ["wq"], name="dq"),
             helper.make_node("MatMul", ["x", "wq"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                          [helper.make_tensor_value_info("y", F, [2, 3])],
                          [numpy_helper.from_array(shape, "wshape"),
                           numpy_helper.from_array(q, "q"),
                           numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ws = find_weights(load(m).graph)
    assert set(ws) == {"w", "q"}
    assert ws["w"].computed and ws["w"].where == "computed by gen (ConstantOfShape)"
    assert ws["w"].size == 12 and ws["w"].owner == "mm2"
    assert ws["q"].nbytes == 12 and ws["q"].owner == "mm1"
    a = analyze(m, {})
    assert a.totals()["params"] == 24 and a.totals()["params_computed"] == 12


def test_weights_inside_a_loop_body_belong_to_the_loop():
    w = np.ones((4, 4), np.float32)
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["wb"], value=numpy_helper.from_array(w, "wb")),
         helper.make_node("MatMul", ["h", "wb"], ["h2"]),
         helper.make_node("Identity", ["c"], ["c2"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", F, [2, 4])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h2", F, [2, 4])])
    g = helper.make_graph([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body,
                                            name="loop")], "g",
                          [helper.make_tensor_value_info("x", F, [2, 4])],
                          [helper.make_tensor_value_info("y", F, [2, 4])],
                          [numpy_helper.from_array(np.array(3, np.int64), "M")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    a = analyze(m, {})
    assert a.totals()["params"] == 16
    assert a.records[0]["params"] == 16 and a.records[0]["macs"] == 3 * 2 * 4 * 4
    (wt,) = a.weights.values()
    assert wt.in_constant_node and wt.where.endswith("in the body of loop")


def test_structure_only_load_counts_the_same_weights(tmp_path):
    """The viewer loads structure only (``load(weights=False)``: tensors over 4 KiB described,
    never read); its weight counts must be those of a full load, Constant-held ones included."""
    rng = np.random.default_rng(1)
    big = rng.standard_normal((64, 64)).astype(np.float32)            # 16 KiB: left unread
    init = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w0")
    nodes = [_const("w1", big),
             helper.make_node("MatMul", ["x", "w0"], ["h"], name="fc0"),
             helper.make_node("MatMul", ["h", "w1"], ["y"], name="fc1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 64])],
                              [helper.make_tensor_value_info("y", F, [1, 64])],
                              initializer=[init])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    light, full = load(str(path), weights=False), load(str(path))
    assert type(light.graph.initializers["w0"]).__name__ == "UnreadTensor"
    assert weight_summary(light.graph) == weight_summary(full.graph)
    assert weight_summary(full.graph)["parameters"] == 2 * 64 * 64
    a, b = io.StringIO(), io.StringIO()
    assert describe(light, a) == describe(full, b) and a.getvalue() == b.getvalue()
