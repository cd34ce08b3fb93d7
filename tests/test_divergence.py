"""``workbench.divergence``: the per-node capture and the "inputs match, output doesn't"
criterion shared by the TensorInspector and the classroom's model checks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import divergence as dv
from workbench.graph.load import load


def _chain(w=2.0, act="Relu") -> onnx.ModelProto:
    """x -> Mul(w) -> act -> Add(1) -> y, with names."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="scale"),
             helper.make_node(act, ["m"], ["a"], name="act"),
             helper.make_node("Add", ["a", "one"], ["y"], name="shift")]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(np.array(w, np.float32), "w"),
                           numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X = np.array([[1.0, -2.0, 3.0], [-0.5, 0.25, 4.0]], np.float32)


def test_capture_keeps_every_value_and_streams():
    seen = []
    cap = dv.capture(_chain(), {"x": X}, on_value=lambda n, name, v: seen.append((n.name, name)))
    assert seen == [("scale", "m"), ("act", "a"), ("shift", "y")]
    assert set(cap.values) == {"x", "w", "one", "m", "a", "y"}
    np.testing.assert_allclose(cap.values["a"], np.maximum(2 * X, 0))
    np.testing.assert_allclose(cap.outputs[0], np.maximum(2 * X, 0) + 1)
    assert cap.sources == {"x", "w", "one"} and [n.name for n in cap.order] == \
        ["scale", "act", "shift"]
    assert dv.capture(_chain(), [X], keep=False).values == {}
    # from a Graph IR or a loaded model too
    assert set(dv.capture(load(_chain()).graph, [X]).values) == set(cap.values)


def test_capture_records_a_failing_node():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "s"], ["y"], name="bad_reshape")]
    g = helper.make_graph(nodes, "fails",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": X, "s": np.array([4], np.int64)}          # 6 elements cannot be [4]
    with pytest.raises(Exception, match="bad_reshape"):
        dv.capture(m, feeds)
    cap = dv.capture(m, feeds, raise_errors=False)
    assert not cap.ok and cap.failed == "bad_reshape" and "bad_reshape" in cap.error
    assert cap.outputs is None and "r" in cap.values       # what ran before it is kept


def test_compare_arrays():
    a = np.array([1.0, 2.0, np.nan], np.float32)
    d = dv.compare_arrays(a, a.copy(), rtol=0, atol=0)
    assert d.ok and d.max_abs == 0.0                       # NaN where the reference has NaN
    d = dv.compare_arrays(a + np.float32(1e-3), a, rtol=0, atol=1e-4)
    assert not d.ok and d.max_abs == pytest.approx(1e-3, rel=1e-3)
    d = dv.compare_arrays(np.ones(3), np.ones((3, 1)), rtol=0, atol=0, ref_name="onnxruntime")
    assert not d.ok and d.note == "shape [3] vs onnxruntime [3, 1]"
    assert d.to_dict() == {"diff": None, "diff_ok": False, "diff_note": d.note}
    assert dv.compare_arrays(np.array(["a"]), np.array(["a"]), rtol=0, atol=0).ok
    assert not dv.compare_arrays(np.array(["a"]), np.array(["b"]), rtol=0, atol=0).ok
    assert dv.compare_arrays([np.ones(2)], [np.ones(2)], rtol=0, atol=0).ok   # sequences
    inf = dv.compare_arrays(np.array([np.inf]), np.array([1.0]), rtol=0, atol=0)
    assert not inf.ok and inf.max_abs is None              # JSON-safe: no inf leaks out


def test_inputs_match_output_does_not():
    ref = dv.capture(_chain(), [X])
    ours = dv.capture(_chain(act="Sigmoid"), [X])
    r = dv.ArrayReference(ref.values, rtol=1e-5, atol=1e-6, values=ours.values)
    d = dv.first_divergence(ours.order, r.matches, sources=ours.sources)
    assert (d.node, d.op_type, d.value, d.inputs) == ("act", "Sigmoid", "a", ["m"])
    assert d.inputs_match and d.differing == []
    assert "'act' (Sigmoid) is the first node whose inputs match" in d.describe()
    # the same values: no divergence
    same = dv.ArrayReference(ref.values, rtol=0, atol=0, values=ref.values)
    assert dv.first_divergence(ref.order, same.matches, sources=ref.sources) is None


def test_an_initializer_that_differs_is_named_upstream():
    ref = dv.capture(_chain(), [X])
    ours = dv.capture(_chain(w=3.0), [X])
    r = dv.ArrayReference(ref.values, rtol=1e-5, atol=1e-6, values=ours.values)
    # initializers compared too (no shared sources): the Mul's input 'w' already differs
    d = dv.first_divergence(ours.order, r.matches, initializers=["w", "one"],
                            graph_inputs=["x"])
    assert d.node == "scale" and not d.inputs_match
    assert d.differing == [("w", "an initializer")]
    assert "already differ" in d.describe()


def test_unchecked_inputs_are_said_and_nodeprotos_work():
    m = _chain(act="Sigmoid")
    calls = {"m": None, "a": False, "y": False}
    d = dv.first_divergence(m.graph.node, calls.get, sources=["x", "w", "one"])
    assert d.node == "act" and d.inputs_match and d.unchecked == ["m"]
    assert "not compared: 'm'" in d.describe()
