"""The two integer arithmetics of 8-bit products (workbench/ops/_integer.py): the spec's exact
sums and onnxruntime's pair-saturating u8 x s8 sums on x86 without VNNI, against expectations
written here with plain loops; the graph pass that selects one; and the guard against the
attribute coming from a model file. None of it depends on the CPU running the tests."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import backend
from workbench.errors import InputError, WorkbenchError
from workbench.graph import passes
from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.ops import _integer
from workbench.ops._integer import (
    IntegerArithmetic,
    counting_saturation,
    pair_saturated_matmul,
    parse_arithmetic,
    saturated_product,
)
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

SAT = IntegerArithmetic.SATURATING_U8S8
EXACT = IntegerArithmetic.EXACT
RNG = np.random.default_rng(7)


def loops(a, b):
    """sum_k clip(a[m, 2k] b[2k, n] + a[m, 2k+1] b[2k+1, n]) by explicit loops (2-D)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.int64)
    for i in range(m):
        for j in range(n):
            for p in range(0, k, 2):
                s = int(a[i, p]) * int(b[p, j])
                if p + 1 < k:
                    s += int(a[i, p + 1]) * int(b[p + 1, j])
                out[i, j] += min(max(s, -32768), 32767)
    return out


def u8(shape, lo=0):
    return RNG.integers(lo, 256, shape).astype(np.uint8)


def s8(shape):
    return RNG.integers(-128, 128, shape).astype(np.int8)


def run(op, *inputs, opset=21, domain="", **attrs):
    entry = lookup(op, domain, opset)
    kw = dict(attribute_defaults(op, domain, opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=1)
    return entry.fn(*inputs, **kw)


# ---------------------------------------------------------------------------------- primitive
@pytest.mark.parametrize("m,k,n", [(3, 7, 4), (5, 8, 3), (1, 1, 1), (2, 64, 5)])
def test_pair_saturated_matmul_equals_the_loops(m, k, n):
    a, b = u8((m, k), lo=128), s8((k, n))   # large activations: many pairs saturate
    np.testing.assert_array_equal(pair_saturated_matmul(a, b), loops(a, b))


def test_pair_saturated_matmul_batches_and_chunks(monkeypatch):
    a, b = u8((2, 3, 9), lo=100), s8((9, 5))
    want = np.stack([loops(a[i], b) for i in range(2)])
    np.testing.assert_array_equal(pair_saturated_matmul(a, b), want)
    b3 = s8((2, 9, 5))
    want3 = np.stack([loops(a[i], b3[i]) for i in range(2)])
    monkeypatch.setattr(_integer, "_CHUNK", 7)   # forces row and column chunks
    np.testing.assert_array_equal(pair_saturated_matmul(a, b3), want3)
    np.testing.assert_array_equal(pair_saturated_matmul(a, b), want)


def test_the_saturation_is_real_and_bounded():
    a = np.array([[255, 255, 255, 255]], np.uint8)
    b = np.array([[127, -128], [127, -128], [1, 1], [1, 1]], np.int8)
    assert pair_saturated_matmul(a, b).tolist() == [[32767 + 510, -32768 + 510]]
    assert (a.astype(int) @ b.astype(int)).tolist() == [[65280, -64770]]


@pytest.mark.parametrize("per", ["scalar", "row-col", "none"])
def test_saturated_product_takes_the_zero_points_out_exactly(per):
    a, b = u8((4, 6), lo=120), s8((6, 3))
    if per == "scalar":
        az, bz = np.array(100, np.uint8), np.array(-3, np.int8)
    elif per == "row-col":
        az, bz = u8((4, 1)), s8((3,))
    else:
        az = bz = None
    azi = 0 if az is None else az.astype(np.int64)
    bzi = 0 if bz is None else bz.astype(np.int64)
    want = (loops(a, b) - azi * b.astype(np.int64).sum(0) - a.astype(np.int64).sum(1,
            keepdims=True) * bzi + 6 * azi * bzi)
    np.testing.assert_array_equal(saturated_product("t", a, az, b, bz), want)


def test_saturated_product_vectors_and_bad_shapes():
    a, b = u8((6,), lo=200), s8((6, 3))
    np.testing.assert_array_equal(saturated_product("t", a, None, b, None),
                                  loops(a[None], b)[0])
    np.testing.assert_array_equal(saturated_product("t", a, None, b[:, 0], None),
                                  loops(a[None], b[:, :1])[0, 0])
    with pytest.raises(WorkbenchError, match=r"t: cannot multiply shapes \(6,\) and \(5, 3\)"):
        saturated_product("t", a, None, s8((5, 3)), None)


def test_counting_saturation_counts_pairs_and_dot_products():
    a = np.array([[255, 255, 1, 1], [1, 1, 1, 1]], np.uint8)
    b = np.array([[127, 1], [127, 1], [1, 1], [1, 1]], np.int8)
    with counting_saturation() as c:
        pair_saturated_matmul(a, b)
    assert (c.pairs, c.saturated, c.dots, c.dots_affected) == (8, 1, 4, 1)
    pair_saturated_matmul(a, b)           # outside the context: nothing counted
    assert c.pairs == 8


def test_parse_arithmetic():
    assert parse_arithmetic("exact") is EXACT
    assert parse_arithmetic("saturating-u8s8") is SAT
    assert parse_arithmetic(SAT) is SAT
    with pytest.raises(InputError, match="'exact', 'saturating-u8s8'"):
        parse_arithmetic("vnni")


# ---------------------------------------------------------------------------------- kernels
def test_matmul_integer_both_ways():
    a, b = u8((3, 8), lo=150), s8((8, 4))
    az, bz = np.array(7, np.uint8), np.array(2, np.int8)
    exact = run("MatMulInteger", a, b, az, bz, opset=10)
    sat = run("MatMulInteger", a, b, az, bz, opset=10, integer_arithmetic=SAT)
    np.testing.assert_array_equal(exact, (a.astype(int) - 7) @ (b.astype(int) - 2))
    want = loops(a, b) - 7 * b.astype(int).sum(0) - a.astype(int).sum(1, keepdims=True) * 2 \
        + 8 * 7 * 2
    np.testing.assert_array_equal(sat, want)
    assert sat.dtype == np.int32 and not np.array_equal(sat, exact)
    # other operand types never saturate (onnxruntime's u8u8 and s8s8 kernels are exact)
    for a2, b2 in ((a, u8((8, 4))), (s8((3, 8)), b)):
        np.testing.assert_array_equal(
            run("MatMulInteger", a2, b2, opset=10, integer_arithmetic=SAT),
            run("MatMulInteger", a2, b2, opset=10))


def test_qlinear_matmul_requantizes_the_saturated_sums():
    a, b = u8((2, 6), lo=200), s8((6, 3))
    one = np.array(1.0, np.float32)
    z8, zs8 = np.array(0, np.uint8), np.array(0, np.int8)
    ys = np.array(512.0, np.float32)
    y = run("QLinearMatMul", a, one, z8, b, one, zs8, ys, z8, integer_arithmetic=SAT)
    want = np.clip(np.rint(loops(a, b) / 512.0), 0, 255)
    np.testing.assert_array_equal(y, want)


def _conv_nhwc_expectation(x, w, xz):
    """QLinearConv's accumulators (one image, no padding, stride 1, one group) with the sum
    over K = (kh, kw, c) - the channels of one tap adjacent, onnxruntime's NHWC order - taken
    in clipped pairs on the raw values, zero point of x taken out afterwards."""
    c, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    cols = np.array([[x[ch, i + p, j + q] for p in range(kh) for q in range(kw)
                      for ch in range(c)] for i in range(oh) for j in range(ow)])
    wk = np.array([[w[o, ch, p, q] for p in range(kh) for q in range(kw) for ch in range(c)]
                   for o in range(m)]).T
    acc = loops(cols, wk) - int(xz) * wk.astype(np.int64).sum(0)
    return acc.T.reshape(m, oh, ow)


@pytest.mark.parametrize("c", [3, 4])
def test_qlinear_conv_pairs_channels_of_a_tap(c):
    """Odd channel counts make the pairs cross taps; the expectation fixes the order."""
    x = u8((1, c, 4, 5), lo=180)
    w = s8((2, c, 2, 2))
    xz = np.array(3, np.uint8)
    one = np.array(1.0, np.float32)
    y = run("QLinearConv", x, one, xz, w, one, np.array(0, np.int8), np.array(256.0, np.float32),
            np.array(0, np.uint8), opset=10, integer_arithmetic=SAT)
    want = np.clip(np.rint(_conv_nhwc_expectation(x[0], w, 3) / 256.0), 0, 255)
    np.testing.assert_array_equal(y[0], want)


def test_qlinear_conv_depthwise_is_exact_unless_zero_points_differ():
    """onnxruntime's depthwise kernel (one channel per group, one weight zero point) sums
    exactly on every CPU; per-channel zero points that differ send it to the u8 x s8 GEMM."""
    x, w = u8((1, 4, 5, 5), lo=200), s8((4, 1, 3, 3))
    w[:] = 127
    one, ys = np.array(1.0, np.float32), np.array(1024.0, np.float32)
    args = (x, one, np.array(0, np.uint8), w, np.full(4, 1.0, np.float32))
    tail = (ys, np.array(0, np.uint8))
    same = np.zeros(4, np.int8)
    exact = run("QLinearConv", *args, same, *tail, opset=10, group=4)
    sat = run("QLinearConv", *args, same, *tail, opset=10, group=4, integer_arithmetic=SAT)
    np.testing.assert_array_equal(sat, exact)
    differ = np.array([0, 1, 0, 1], np.int8)
    exact = run("QLinearConv", *args, differ, *tail, opset=10, group=4)
    sat = run("QLinearConv", *args, differ, *tail, opset=10, group=4, integer_arithmetic=SAT)
    assert (sat < exact).any()


def test_kernels_refuse_the_attribute_from_a_model_file():
    """Only the engine sets integer_arithmetic; a model file's attribute of that name (a
    string: com.microsoft ops have no schema to reject it) is an error naming the node."""
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "s", "s"], ["y"],
                            domain="com.microsoft", name="sneaky",
                            integer_arithmetic="saturating-u8s8")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8,
                                                                      [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                          [numpy_helper.from_array(np.ones((2, 1), np.int8), "b"),
                           numpy_helper.from_array(np.array(1.0, np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    rep = backend.prepare(m)
    with pytest.raises(WorkbenchError, match=r"sneaky.*integer_arithmetic.*not an ONNX"):
        rep.run([np.ones((1, 2), np.uint8)])


# ---------------------------------------------------------------------------------- the pass
def _graph():
    loop_body = Graph("body", [Node("MatMulInteger", ["a", "b"], ["y"], {}, "inner")],
                      [ValueInfo("a")], [ValueInfo("y")], {"b": np.ones((2, 2), np.int8)},
                      {}, {"": 17})
    nodes = [Node("MatMulInteger", ["x", "w"], ["p"], {}, "mm"),
             Node("Relu", ["p"], ["r"], {}, "relu"),
             Node("If", ["c"], ["z"], {"then_branch": loop_body, "else_branch": loop_body},
                  "branch")]
    return Graph("g", nodes, [ValueInfo("x"), ValueInfo("c")], [ValueInfo("r")],
                 {"w": np.ones((2, 2), np.int8)}, {}, {"": 17})


def test_pass_marks_the_integer_product_nodes_only():
    g = _graph()
    marked = passes.set_integer_arithmetic(g, "saturating-u8s8")
    assert [n.name for n in passes.integer_product_nodes(g)] == ["mm"]
    attrs = {n.name: n.attrs for n in marked.nodes}
    assert attrs["mm"]["integer_arithmetic"] is SAT
    assert "integer_arithmetic" not in attrs["relu"]
    inner = attrs["branch"]["then_branch"].nodes[0]
    assert inner.attrs["integer_arithmetic"] is SAT
    # the caller's graph is untouched
    assert "integer_arithmetic" not in g.nodes[0].attrs
    assert "integer_arithmetic" not in g.nodes[2].attrs["then_branch"].nodes[0].attrs


def test_prepare_refuses_an_unknown_arithmetic():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "g",
                                            [a], [helper.make_tensor_value_info(
                                                "b", TensorProto.FLOAT, [1])]))
    with pytest.raises(InputError, match="integer_arithmetic='avx2'"):
        backend.prepare(m, integer_arithmetic="avx2")


def test_folded_constant_products_follow_the_arithmetic():
    """Constant folding runs before planning: a product of two constants is folded in the
    chosen arithmetic too."""
    a = np.array([[255, 255]], np.uint8)
    b = np.array([[127], [127]], np.int8)
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
                          [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert backend.prepare(m).run([])[0].tolist() == [[64770]]
    assert backend.prepare(m, integer_arithmetic="saturating-u8s8").run([])[0].tolist() == \
        [[32767]]
