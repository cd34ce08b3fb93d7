"""Per-node MACs / FLOPs / bytes on single-node models, against the formulas counted by hand."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.analysis import analyze
from workbench.errors import InputError

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(g, opset_imports=ops)


def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def _rng():
    return np.random.default_rng(0)


def _row(a, op):
    rows = [r for r in a.records if r["op"] == op]
    assert len(rows) == 1, [r["op"] for r in a.records]
    return rows[0]


@pytest.mark.parametrize("group,stride,dil,bias", [(1, 1, 1, True), (2, 2, 1, False),
                                                   (8, 1, 2, True)])
def test_conv_macs_flops_bytes(group, stride, dil, bias):
    n, cin, cout, h, k = 2, 8, 16, 15, 3
    w = _rng().standard_normal((cout, cin // group, k, k)).astype(np.float32)
    b = np.ones(cout, np.float32)
    ins = ["x", "w", "b"] if bias else ["x", "w"]
    node = helper.make_node("Conv", ins, ["y"], group=group, strides=[stride, stride],
                            dilations=[dil, dil], pads=[1, 1, 1, 1], name="conv")
    inits = [("w", w)] + ([("b", b)] if bias else [])
    m = _model([node], [_vi("x", ["N", cin, h, h])], [_vi("y", None)], inits)
    a = analyze(m, {"x": (n, cin, h, h)})
    r = _row(a, "Conv")
    hout = (h + 2 - dil * (k - 1) - 1) // stride + 1
    y = n * cout * hout * hout
    macs = y * (cin // group) * k * k          # Cout*Hout*Wout*Cin/groups*kh*kw per image
    assert r["output_shape"] == (n, cout, hout, hout)
    assert r["macs"] == macs
    assert r["flops"] == 2 * macs + (y if bias else 0)
    assert r["params"] == w.size + (cout if bias else 0)
    assert r["bytes_read"] == 4 * (n * cin * h * h + w.size + (cout if bias else 0))
    assert r["bytes_written"] == r["activation_bytes"] == 4 * y
    assert r["intensity"] == pytest.approx(r["flops"] / (r["bytes_read"] + r["bytes_written"]))
    assert r["shapes_from"] == "onnx" and r["group"] == ""


def test_conv_transpose_macs():
    w = np.zeros((4, 3, 3, 3), np.float32)     # [Cin, Cout/groups, kh, kw]
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])
    a = analyze(_model([node], [_vi("x", [1, 4, 5, 5])], [_vi("y", None)], [("w", w)]), {})
    r = _row(a, "ConvTranspose")
    assert r["output_shape"] == (1, 3, 11, 11)
    assert r["macs"] == 4 * 5 * 5 * 3 * 3 * 3   # each input element scatters Cout*kh*kw


def test_matmul_and_gemm():
    # batched MatMul: [2, 3, 5, 7] @ [7, 11] -> M*N*K per batch
    mm = helper.make_node("MatMul", ["a", "w"], ["y"])
    a = analyze(_model([mm], [_vi("a", [2, 3, 5, 7])], [_vi("y", None)],
                       [("w", np.zeros((7, 11), np.float32))]), {})
    assert _row(a, "MatMul")["macs"] == 2 * 3 * 5 * 11 * 7
    # Gemm with transA, alpha and a bias: K from A's first dim
    g = helper.make_node("Gemm", ["a", "w", "c"], ["y"], transA=1, transB=1, alpha=0.5)
    a = analyze(_model([g], [_vi("a", [7, 5])], [_vi("y", None)],
                       [("w", np.zeros((11, 7), np.float32)),
                        ("c", np.zeros(11, np.float32))]), {})
    r = _row(a, "Gemm")
    assert r["macs"] == 5 * 11 * 7
    assert r["flops"] == 2 * 5 * 11 * 7 + 5 * 11 + 5 * 11    # + bias + alpha scaling
    assert r["params"] == 11 * 7 + 11


def test_linear_in_out_per_token():
    """A Linear layer on [batch, seq, in] costs in*out MACs per token."""
    b, s, i, o = 3, 10, 32, 48
    mm = helper.make_node("MatMul", ["x", "w"], ["h"])
    add = helper.make_node("Add", ["h", "bias"], ["y"])
    a = analyze(_model([mm, add], [_vi("x", ["B", "S", i])], [_vi("y", None)],
                       [("w", np.zeros((i, o), np.float32)), ("bias", np.zeros(o, np.float32))]),
                dims={"B": b, "S": s})
    t = a.totals()
    assert t["macs"] == b * s * i * o
    assert t["flops"] == 2 * b * s * i * o + b * s * o      # the bias add: 1 per output
    assert t["params"] == i * o + o


def test_elementwise_softmax_norm_pool_reduce():
    x = [2, 4, 6, 6]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s"], axis=-1),
             helper.make_node("BatchNormalization", ["s", "g", "b", "m", "v"], ["bn"]),
             helper.make_node("MaxPool", ["bn"], ["p"], kernel_shape=[3, 3]),
             helper.make_node("AveragePool", ["bn"], ["ap"], kernel_shape=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
             helper.make_node("ReduceMean", ["ap"], ["rm"], keepdims=0),
             helper.make_node("Sum", ["x", "x", "x"], ["sum3"]),
             helper.make_node("Reshape", ["x", "shape"], ["flat"])]
    c = np.ones(4, np.float32)
    inits = [("g", c), ("b", c), ("m", c), ("v", c), ("shape", np.array([2, -1], np.int64))]
    m = _model(nodes, [_vi("x", x)], [_vi(o, None) for o in ("gp", "rm", "sum3", "flat")], inits)
    a = analyze(m, {})
    e = 2 * 4 * 6 * 6
    assert _row(a, "Relu")["flops"] == e
    assert _row(a, "Softmax")["flops"] == 5 * e
    bn = _row(a, "BatchNormalization")
    assert bn["flops"] == 2 * e and bn["params"] == 8 and bn["buffers"] == 8
    assert _row(a, "MaxPool")["flops"] == 2 * 4 * 4 * 4 * 9
    assert _row(a, "AveragePool")["flops"] == 2 * 4 * 5 * 5 * (4 + 1)
    assert _row(a, "GlobalAveragePool")["flops"] == 2 * 4 * 4 * 4 + 2 * 4
    assert _row(a, "ReduceMean")["flops"] == 2 * 4 * 5 * 5 + 1
    assert _row(a, "Sum")["flops"] == 2 * e
    r = _row(a, "Reshape")
    assert r["flops"] == 0 and r["bytes_read"] == 0 and r["bytes_written"] == 0
    assert r["params"] == 0                        # an int64 shape is not a weight


def test_lstm_gru_macs():
    s, b, i, h = 5, 2, 3, 4
    w = np.zeros((1, 4 * h, i), np.float32)
    r = np.zeros((1, 4 * h, h), np.float32)
    lstm = helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=h)
    a = analyze(_model([lstm], [_vi("x", [s, b, i])], [_vi("y", None)],
                       [("w", w), ("r", r)]), {})
    row = _row(a, "LSTM")
    assert row["macs"] == s * b * 4 * h * (i + h)
    assert row["flops"] == 2 * row["macs"] + s * b * h * 9
    assert row["params"] == w.size + r.size
    gw = np.zeros((2, 3 * h, i), np.float32)
    gr = np.zeros((2, 3 * h, h), np.float32)
    gb = np.zeros((2, 6 * h), np.float32)
    gru = helper.make_node("GRU", ["x", "w", "r", "b"], ["y"], hidden_size=h,
                           direction="bidirectional")
    a = analyze(_model([gru], [_vi("x", [s, b, i])], [_vi("y", None)],
                       [("w", gw), ("r", gr), ("b", gb)]), {})
    row = _row(a, "GRU")
    assert row["macs"] == 2 * s * b * 3 * h * (i + h)


def test_attention_contrib_and_fused_forms():
    # com.microsoft::Attention: QKV projection + two attention products
    b, s, hid, heads = 2, 6, 16, 4
    w = np.zeros((hid, 3 * hid), np.float32)
    bias = np.zeros(3 * hid, np.float32)
    att = helper.make_node("Attention", ["x", "w", "bias"], ["y"], domain="com.microsoft",
                           num_heads=heads)
    a = analyze(_model([att], [_vi("x", [b, s, hid])], [_vi("y", [b, s, hid])],
                       [("w", w), ("bias", bias)], extra_opsets=[("com.microsoft", 1)]), {})
    r = _row(a, "com.microsoft::Attention")
    proj = b * s * hid * 3 * hid
    scores = b * heads * s * s
    d = hid // heads
    assert r["macs"] == proj + 2 * scores * d
    # the engine's own FusedAttention in an optimised graph: Q @ K^T, softmax, @ V
    q = [b, heads, s, d]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Softmax", ["qk"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    m = _model(nodes, [_vi("q", q), _vi("k", q), _vi("v", q)], [_vi("y", None)])
    plain = analyze(m, {})
    fused = analyze(m, {}, optimized=True)
    ops = {r["op"] for r in fused.records}
    assert "com.workbench::FusedAttention" in ops, ops
    assert fused.totals()["macs"] == plain.totals()["macs"] == 2 * b * heads * s * s * d


def test_fused_conv_in_optimised_graph_counts_like_the_original():
    w = _rng().standard_normal((8, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    m = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", None)],
               [("w", w), ("b", np.zeros(8, np.float32))])
    plain, fused = analyze(m, {}), analyze(m, {}, optimized=True)
    r = _row(fused, "com.workbench::FusedConv")
    assert r["macs"] == _row(plain, "Conv")["macs"] == 8 * 8 * 8 * 3 * 9
    assert r["flops"] == plain.totals()["flops"]      # bias + activation folded in
    assert fused.totals()["params"] == plain.totals()["params"]


def test_ms_fused_matmul_and_einsum():
    fm = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=1)
    a = analyze(_model([fm], [_vi("a", [4, 7, 5]), _vi("b", [4, 7, 3])], [_vi("y", [4, 5, 3])],
                       extra_opsets=[("com.microsoft", 1)]), {})
    assert _row(a, "com.microsoft::FusedMatMul")["macs"] == 4 * 5 * 3 * 7
    ein = helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")
    a = analyze(_model([ein], [_vi("a", [2, 3, 4]), _vi("b", [2, 4, 5])], [_vi("y", None)]), {})
    assert _row(a, "Einsum")["macs"] == 2 * 3 * 4 * 5


def test_tree_ensemble_nodes_visited():
    # one tree: root -> (leaf, node -> (leaf, leaf)); expected path 1*1/2 + 2*1/4 + 2*1/4
    attrs = dict(nodes_treeids=[0] * 5, nodes_nodeids=[0, 1, 2, 3, 4],
                 nodes_featureids=[0, 0, 1, 0, 0], nodes_values=[0.5, 0, 0.2, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "BRANCH_LEQ", "LEAF", "LEAF"],
                 nodes_truenodeids=[1, 0, 3, 0, 0], nodes_falsenodeids=[2, 0, 4, 0, 0],
                 target_treeids=[0, 0, 0], target_nodeids=[1, 3, 4], target_ids=[0, 0, 0],
                 target_weights=[1.0, 2.0, 3.0], n_targets=1)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            **attrs)
    m = _model([node], [_vi("x", ["N", 2])], [_vi("y", None)],
               extra_opsets=[("ai.onnx.ml", 3)])
    a = analyze(m, dims={"N": 100})
    r = _row(a, "ai.onnx.ml::TreeEnsembleRegressor")
    assert r["macs"] == 0
    assert r["flops"] == 100 * 1.5 + 100          # visits, plus one add per (row, tree)
    assert "deepest path 2" in r["note"]


def test_unknown_op_is_none_not_zero():
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    m = _model([node], [_vi("x", [2, 2])], [_vi("y", [2, 2])],
               extra_opsets=[("com.example", 1)])
    a = analyze(m, {}, run_unknown=False)
    r = a.records[0]
    assert r["flops"] is None and "no cost rule" in r["note"]
    assert a.totals()["nodes_without_flops"] == 1
    assert "without a FLOP count: com.example::Frobnicate" in a.summary()


def test_unbound_dims_are_an_error_naming_them():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 3])],
               [_vi("y", None)])
    with pytest.raises(InputError, match="'x' dim 0 \\('batch'\\)"):
        analyze(m)
    assert analyze(m, default_dim=4).input_shapes == {"x": (4, 3)}
    assert analyze(m, dims={"batch": 2}).totals()["flops"] == 6
    with pytest.raises(InputError, match="rank"):
        analyze(m, {"x": (1, 2, 3)})
    with pytest.raises(InputError, match="inputs are"):
        analyze(m, {"nope": (1, 3)})


def test_shapes_inference_cannot_find_come_from_a_run():
    """NonZero's output length depends on the data: onnx leaves it symbolic, our engine's
    run at the bound shapes gives it (and the rows say so)."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("Cast", ["t"], ["y"], to=F)]
    m = _model(nodes, [_vi("x", [3, 4])], [_vi("y", None)])
    a = analyze(m, {})
    r = _row(a, "Transpose")
    assert r["shapes_from"] == "run"
    assert r["output_shape"][1] == 2
    assert any("running our engine" in n for n in a.notes)
    b = analyze(m, {}, run_unknown=False)
    assert _row(b, "Transpose")["shapes_from"] == "unknown"
    assert _row(b, "Transpose")["bytes_written"] is None


def test_model_from_path_bytes_and_graph(tmp_path):
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", None)])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    for src in (str(p), m.SerializeToString(), m):
        assert analyze(src, {}).totals()["flops"] == 6


def _body(nodes, inputs, outputs):
    return helper.make_graph(nodes, "body", inputs, outputs)


def test_control_flow_bodies_counted():
    # Loop with a constant trip count: M x the body's cost
    w = np.zeros((4, 4), np.float32)
    body = _body([helper.make_node("MatMul", ["h", "w"], ["h2"]),
                  helper.make_node("Identity", ["c"], ["c2"])],
                 [_vi("i", [], TensorProto.INT64), _vi("c", [], TensorProto.BOOL),
                  _vi("h", [2, 4])],
                 [_vi("c2", [], TensorProto.BOOL), _vi("h2", [2, 4])])
    loop = helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="loop")
    m = _model([loop], [_vi("x", [2, 4])], [_vi("y", [2, 4])],
               [("M", np.array(5, np.int64)), ("w", w)])
    r = _row(analyze(m, {}), "Loop")
    assert r["macs"] == 5 * 2 * 4 * 4 and "5 iterations" in r["note"]
    # If: the larger branch
    big = _body([helper.make_node("MatMul", ["x", "w"], ["a"])], [], [_vi("a", [2, 4])])
    small = _body([helper.make_node("Relu", ["x"], ["b"])], [], [_vi("b", [2, 4])])
    iff = helper.make_node("If", ["cond"], ["y"], then_branch=big, else_branch=small)
    m = _model([iff], [_vi("cond", [], TensorProto.BOOL), _vi("x", [2, 4])],
               [_vi("y", [2, 4])], [("w", w)])
    r = _row(analyze(m, {}), "If")
    assert r["macs"] == 2 * 4 * 4 and "larger branch (then_branch)" in r["note"]
    # Scan over axis 0 of a [3, 2, 4] sequence
    sbody = _body([helper.make_node("Add", ["s", "xt"], ["s2"]),
                   helper.make_node("Identity", ["s2"], ["o"])],
                  [_vi("s", [2, 4]), _vi("xt", [2, 4])], [_vi("s2", [2, 4]), _vi("o", [2, 4])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["sf", "ys"], body=sbody, num_scan_inputs=1)
    m = _model([scan], [_vi("s0", [2, 4]), _vi("xs", [3, 2, 4])],
               [_vi("sf", [2, 4]), _vi("ys", [3, 2, 4])])
    r = _row(analyze(m, {}), "Scan")
    assert r["flops"] == 3 * 8 and "3 iterations" in r["note"]
