"""Exporter quirks repaired at load (workbench/graph/quirks.py) and shown by `workbench info`:
nodes out of topological order, input dims written as -1 / 0, unused opset domains,
half-precision weights behind float32 I/O, onnxruntime's ONNX-domain operators."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import backend
from workbench.cli import describe
from workbench.errors import ModelLoadError
from workbench.graph.load import load
from workbench.graph.toposort import toposort_nodes


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_imports=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]
                          + [helper.make_opsetid(d, v) for d, v in extra_imports])
    m.ir_version = 9
    return m


def _chain(order):
    """x -> a(Relu) -> b(Neg) -> c(Abs) -> d(Sigmoid) -> y, the nodes listed in ``order``."""
    spec = {"a": ("Relu", "x", "t1"), "b": ("Neg", "t1", "t2"), "c": ("Abs", "t2", "t3"),
            "d": ("Sigmoid", "t3", "y")}
    nodes = [helper.make_node(spec[k][0], [spec[k][1]], [spec[k][2]], name=k) for k in order]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])


def test_unsorted_graph_is_sorted_runs_and_says_so():
    m = _chain("dcba")
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(m)
    before = m.SerializeToString()
    loaded = load(m)
    assert m.SerializeToString() == before  # the caller's proto is left alone
    assert [n.name for n in loaded.graph.nodes] == list("abcd")
    assert any("topological order" in n for n in loaded.notes)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y = backend.prepare(m).run([x])[0]
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.abs(-np.maximum(x, 0)))), rtol=1e-6)
    out = io.StringIO()
    facts = describe(loaded, out)
    assert "sorted at load" in out.getvalue() and facts["notes"]


def test_sort_is_stable_and_leaves_sorted_graphs_alone():
    # two independent branches written interleaved: a valid order stays exactly as written
    nodes = [helper.make_node("Relu", ["x"], ["p"], name="p1"),
             helper.make_node("Neg", ["x"], ["q"], name="q1"),
             helper.make_node("Abs", ["q"], ["q2"], name="q2"),
             helper.make_node("Abs", ["p"], ["p2"], name="p2"),
             helper.make_node("Add", ["p2", "q2"], ["y"], name="sum")]
    assert toposort_nodes(nodes) == [0, 1, 2, 3, 4]
    loaded = load(_model(nodes, [helper.make_tensor_value_info("x", 1, [2])],
                         [helper.make_tensor_value_info("y", 1, [2])]))
    assert not any("topological" in n for n in loaded.notes)
    # one misplaced node moves just behind its producer; the others keep their order
    moved = [nodes[3], nodes[0], nodes[1], nodes[2], nodes[4]]
    assert [moved[i].name for i in toposort_nodes(moved)] == ["p1", "p2", "q1", "q2", "sum"]


def test_cycle_is_a_clear_load_error_naming_the_nodes():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Neg", ["x"], ["y"], name="fine")]
    m = _model(nodes, [helper.make_tensor_value_info("x", 1, [2])],
               [helper.make_tensor_value_info("y", 1, [2])])
    with pytest.raises(ModelLoadError, match=r"cycle.*first \(Add\).*second \(Relu\)"):
        load(m)


def test_unsorted_subgraph_is_sorted():
    then = helper.make_graph(
        [helper.make_node("Neg", ["t"], ["o"], name="neg"),
         helper.make_node("Relu", ["x"], ["t"], name="relu")], "then", [],
        [helper.make_tensor_value_info("o", 1, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o2"])], "else", [],
                              [helper.make_tensor_value_info("o2", 1, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    m = _model([node], [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                        helper.make_tensor_value_info("x", 1, [2])],
               [helper.make_tensor_value_info("y", 1, [2])])
    x = np.array([-1.0, 2.0], np.float32)
    y = backend.prepare(m).run({"c": np.array(True), "x": x})[0]
    np.testing.assert_array_equal(y, [0.0, -2.0])


@pytest.mark.parametrize("dim", [-1, 0])
def test_input_dims_written_as_minus_one_or_zero_mean_any_size(dim):
    x_vi = helper.make_tensor_value_info("x", 1, [dim, 3])
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x_vi],
               [helper.make_tensor_value_info("y", 1, [dim, 3])])
    loaded = load(m)
    assert any("'x'" in n and f"dim 0 = {dim}" in n and "any size" in n for n in loaded.notes)
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(backend.prepare(m).run([x])[0], np.maximum(x, 0))
    out = io.StringIO()
    describe(loaded, out)
    assert "any size" in out.getvalue()


@pytest.mark.parametrize("half", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_half_precision_weights_behind_float32_io(half):
    w = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    w_t = helper.make_tensor("w", half, [3, 4],
                             vals=numpy_helper.from_array(w.astype(
                                 helper.tensor_dtype_to_np_dtype(half)), "w").raw_data,
                             raw=True)
    nodes = [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", 1, [2, 3])],
               [helper.make_tensor_value_info("y", 1, [2, 4])], [w_t])
    loaded = load(m)
    assert any("half precision" in n for n in loaded.notes)
    x = np.ones((2, 3), np.float32)
    import onnxruntime as ort  # noqa: PLC0415
    if half == TensorProto.FLOAT16:
        ref = ort.InferenceSession(m.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    else:
        import ml_dtypes  # noqa: PLC0415
        ref = x @ w.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(backend.prepare(m).run([x])[0], ref, rtol=1e-6)


def test_unused_opset_domains_are_noted_not_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", 1, [2])],
               [helper.make_tensor_value_info("y", 1, [2])],
               extra_imports=[("ai.onnx.ml", 3), ("com.microsoft", 1), ("org.pytorch.aten", 1)])
    loaded = load(m)
    note = next(n for n in loaded.notes if "no node uses" in n)
    assert "ai.onnx.ml" in note and "com.microsoft" in note and "org.pytorch.aten" in note
    np.testing.assert_array_equal(backend.prepare(m).run([np.array([-1, 1], np.float32)])[0],
                                  [0, 1])


def test_info_lists_support_per_domain():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("FastGelu", ["a"], ["b"], domain="com.microsoft"),
             helper.make_node("Mystery", ["b"], ["y"], domain="com.example")]
    m = _model(nodes, [helper.make_tensor_value_info("x", 1, [2])],
               [helper.make_tensor_value_info("y", 1, [2])],
               extra_imports=[("com.microsoft", 1), ("com.example", 2)])
    out = io.StringIO()
    facts = describe(load(m, check=False), out)
    text = out.getvalue()
    assert "support per domain:" in text
    assert "ai.onnx (opset 17): 1 op type(s) with kernels, 0 missing" in text
    assert "com.microsoft (opset 1): 1 op type(s) with kernels, 0 missing" in text
    assert "com.example (opset 2): 0 op type(s) with kernels, 1 missing: Mystery" in text
    assert facts["domains"]["com.microsoft"]["supported"] == ["FastGelu"]
    assert facts["domains"]["com.example"]["missing"] == ["Mystery"]
