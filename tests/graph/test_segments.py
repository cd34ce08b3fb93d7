"""Shape segments (workbench/graph/segments.py): the fast schedule of plain CPU runs against the
plain schedule (a run with a hook takes the plain one), on dynamic shapes, data-dependent
shapes, errors and shape-derived graph outputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import WorkbenchError
from workbench.graph.executor import Plan
from workbench.graph.load import load


def _plain(plan, inputs):
    return plan.run(inputs, hook=lambda node, outs: None)


def _attention_like():
    """x (batch, seq, 8) -> heads reshape via Shape/Gather/Unsqueeze/Concat, a causal mask
    from Range/LessOrEqual/Where, position rows gathered from a table by Range."""
    c = {name: numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)
         for name, v in (("i0", 0), ("i1", 1), ("two", [2]), ("four", [4]), ("ax0", [0]),
                         ("ax1", [1]), ("one", 1), ("zero", 0))}
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32), "table")
    neg = numpy_helper.from_array(np.array(-1e4, np.float32), "neg")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        helper.make_node("Unsqueeze", ["t", "ax0"], ["tu"]),
        helper.make_node("Concat", ["bu", "tu", "two", "four"], ["shape4"], axis=0),
        helper.make_node("Range", ["zero", "t", "one"], ["pos"]),
        helper.make_node("Gather", ["table", "pos"], ["pe"], axis=0),
        helper.make_node("Add", ["x", "pe"], ["xp"]),
        helper.make_node("Reshape", ["xp", "shape4"], ["heads"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["prow"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["pcol"]),
        helper.make_node("LessOrEqual", ["prow", "pcol"], ["causal"]),
        helper.make_node("Transpose", ["x"], ["xT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xT"], ["scores"]),
        helper.make_node("Where", ["causal", "scores", "neg"], ["masked"]),
    ]
    g = helper.make_graph(
        nodes, "attn_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("heads", TensorProto.FLOAT, ["batch", "seq", 2, 4]),
         helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["batch", "seq", "seq"])],
        list(c.values()) + [table, neg])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fast_schedule_matches_plain_over_changing_shapes():
    plan = Plan(load(_attention_like()).graph)
    assert plan._fast is not None
    segs = [f.segment for f in plan._fast if f.segment is not None]
    assert segs and sum(len(s.members) for s in segs) >= 10
    rng = np.random.default_rng(1)
    for shape in [(1, 5, 8), (3, 7, 8), (1, 5, 8), (2, 1, 8), (3, 7, 8), (1, 64, 8)]:
        x = rng.standard_normal(shape).astype(np.float32)
        fast = plan.run([x])
        plain = _plain(plan, [x])
        for a, b in zip(fast, plain):
            assert a.shape == b.shape and np.array_equal(a, b)
        b_, t = shape[:2]
        assert fast[0].shape == (b_, t, 2, 4)
        keep = np.tril(np.ones((t, t), bool))  # causal[i, j] = j <= i
        assert np.all(fast[1][:, ~keep] == np.float32(-1e4))
        scores = x @ x.transpose(0, 2, 1)
        np.testing.assert_allclose(fast[1][:, keep], scores[:, keep], rtol=1e-5, atol=1e-5)
    assert sum(s.hits for s in segs) > 0      # repeated shapes were remembered


def test_remembered_values_are_read_only_and_outputs_writable():
    plan = Plan(load(_attention_like()).graph)
    x = np.ones((2, 3, 8), np.float32)
    for _ in range(2):
        heads, masked = plan.run([x])
    heads += 1       # graph outputs belong to the caller
    masked[...] = 0
    again = plan.run([x])
    assert np.array_equal(again[0], _plain(plan, [x])[0])
    seg = next(f.segment for f in plan._fast if f.segment is not None and f.segment.memo)
    for out, _ in seg.memo.values():
        assert all(not v.flags.writeable for v in out)


def test_data_dependent_shape_follows_the_data():
    """Shape(NonZero(x)): the same input shape, different data, different results."""
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]),
         helper.make_node("Shape", ["nz"], ["s"]),
         helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
         helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["nf", "x"], ["y"])],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    plan = Plan(load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph)
    assert plan._fast is not None
    for x in ([1, 0, 0, 0], [1, 2, 0, 0], [1, 0, 0, 0], [1, 2, 3, 4]):
        x = np.asarray(x, np.float32)
        (y,) = plan.run([x])
        assert np.array_equal(y, np.count_nonzero(x) * x)


def test_errors_in_a_segment_name_the_node():
    m = _attention_like()
    plan = Plan(load(m).graph)
    x = np.ones((2, 3, 5), np.float32)   # 5 features: the (b, t, 2, 4) reshape cannot hold them
    with pytest.raises(WorkbenchError) as fast:
        plan.run([x])
    with pytest.raises(WorkbenchError) as plain:
        _plain(plan, [x])
    assert str(fast.value) == str(plain.value)


def test_shape_derived_graph_output_is_not_remembered():
    g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Concat", ["s", "s"], ["ss"], axis=0),
         helper.make_node("Reshape", ["x", "s"], ["y"])],
        "shape_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("ss", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    plan = Plan(load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph)
    for n in (2, 5, 2):
        ss, y = plan.run([np.zeros((n, 3), np.float32)])
        assert list(ss) == [n, 3, n, 3] and ss.flags.writeable
        ss[0] = 99   # must not leak into the next run
        assert y.shape == (n, 3)
