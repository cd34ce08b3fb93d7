"""fuse_attention_layout (workbench/graph/passes.py): the head split (Reshape -> Transpose)
before a FusedAttention node and the head merge (Transpose -> Reshape) after it folded into the
node; every fused graph against the same graph run unoptimised, and the variants that must not
fold."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import ShapeError
from workbench.graph import passes
from workbench.graph.load import load
from workbench.ops.linalg import fused_attention
from workbench.ops.registry import FUSED_DOMAIN
from workbench.runtime import Plan

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
H, D = 4, 8


def _model(*, dynamic_shape=True, k_perm=(0, 2, 3, 1), merge="transpose_reshape",
           extra_output=None, allowzero=None, shared_q=False, mask="add"):
    """x (b, s, H*D) -> three projections -> heads -> attention -> merged back.

    ``dynamic_shape``: the split / merge shapes are computed in the graph from x's shape
    (Shape -> Gather -> Unsqueeze -> Concat, as exported) instead of constants with 0."""
    inits = [numpy_helper.from_array(np.array(np.sqrt(D), np.float32), "c")]
    for k in "qkv":
        inits.append(numpy_helper.from_array(
            RNG.standard_normal((H * D, H * D)).astype(np.float32) * 0.3, f"w{k}"))
    nodes = []
    if dynamic_shape:
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("i0", 0), ("i1", 1), ("ax0", [0]), ("hh", [H]), ("dd", [D]),
                   ("hd", [H * D]))]
        nodes += [helper.make_node("Shape", ["x"], ["xs"]),
                  helper.make_node("Gather", ["xs", "i0"], ["b0"], axis=0),
                  helper.make_node("Gather", ["xs", "i1"], ["s0"], axis=0),
                  helper.make_node("Unsqueeze", ["b0", "ax0"], ["b1"]),
                  helper.make_node("Unsqueeze", ["s0", "ax0"], ["s1"]),
                  helper.make_node("Concat", ["b1", "s1", "hh", "dd"], ["split_shape"], axis=0),
                  helper.make_node("Concat", ["b1", "s1", "hd"], ["merge_shape"], axis=0)]
    else:
        inits += [numpy_helper.from_array(np.array([0, 0, H, D], np.int64), "split_shape"),
                  numpy_helper.from_array(np.array([0, 0, H * D], np.int64), "merge_shape")]
    perms = {"q": (0, 2, 1, 3), "k": tuple(k_perm), "v": (0, 2, 1, 3)}
    heads = {}
    for k in "qkv":
        nodes.append(helper.make_node("MatMul", ["x", f"w{k}"], [f"{k}p"]))
        kw = {} if allowzero is None else {"allowzero": allowzero}
        nodes.append(helper.make_node("Reshape", [f"{k}p", "split_shape"], [f"{k}r"], **kw))
        nodes.append(helper.make_node("Transpose", [f"{k}r"], [f"{k}h"], perm=list(perms[k])))
        heads[k] = f"{k}h"
    if tuple(k_perm) == (0, 2, 1, 3):   # K in heads layout: transposed for the product
        nodes.append(helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]))
        heads["k"] = "kt"
    q_in = heads["q"]
    nodes.append(helper.make_node("MatMul", [q_in, heads["k"]], ["s0_"]))
    nodes.append(helper.make_node("Div", ["s0_", "c"], ["s1_"]))
    inputs = [helper.make_tensor_value_info("x", F, ["b", "s", H * D])]
    cur = "s1_"
    if mask == "add":
        inputs.append(helper.make_tensor_value_info("m", F, ["b", 1, 1, "s"]))
        nodes.append(helper.make_node("Add", [cur, "m"], ["s2_"]))
        cur = "s2_"
    nodes.append(helper.make_node("Softmax", [cur], ["p"], axis=-1))
    v_in = heads["q"] if shared_q else heads["v"]
    nodes.append(helper.make_node("MatMul", ["p", v_in], ["ctx"]))
    out = "ctx"
    if merge in ("transpose", "transpose_reshape"):
        nodes.append(helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]))
        out = "ctx_t"
    if merge == "transpose_reshape":
        nodes.append(helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["y"]))
        out = "y"
    def info(name):
        dims = ["b", "s", H * D] if name == "y" else ["d0", "d1", "d2", "d3"]
        return helper.make_tensor_value_info(name, F, dims)

    outs = [info(out)] + ([info(extra_output)] if extra_output else [])
    g = helper.make_graph(nodes, "mha", inputs, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model, b=2, s=5):
    feeds = [RNG.standard_normal((b, s, H * D)).astype(np.float32)]
    if len(model.graph.input) > 1:
        m = np.zeros((b, 1, 1, s), np.float32)
        m[-1, ..., s // 2:] = -1e4
        feeds.append(m)
    return feeds


def _compare(model, **kw):
    g = load(model).graph
    feeds = _feeds(model, **kw)
    plain = Plan(g).run(feeds)
    opt = passes.optimize(g)
    got = Plan(opt).run(feeds)
    for a, b in zip(got, plain):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the fast schedule (shape segments) gives the same as the hooked plain schedule
    plan = Plan(opt)
    again = plan.run(feeds)
    hooked = plan.run(feeds, hook=lambda node, outs: None)
    for a, b in zip(again, hooked):
        np.testing.assert_array_equal(a, b)
    return opt


def _attention(opt):
    fa = [n for n in opt.nodes if n.op_type == "FusedAttention" and n.domain == FUSED_DOMAIN]
    assert len(fa) == 1, [n.op_type for n in opt.nodes]
    return fa[0]


@pytest.mark.parametrize("dynamic_shape", [True, False])
@pytest.mark.parametrize("b,s", [(1, 1), (2, 5), (1, 7)])
def test_split_and_merge_folded(dynamic_shape, b, s):
    opt = _compare(_model(dynamic_shape=dynamic_shape), b=b, s=s)
    fa = _attention(opt)
    ops = [n.op_type for n in opt.nodes]
    assert "Transpose" not in ops and "Reshape" not in ops, ops
    assert fa.attrs["q_perm"] == [0, 2, 1, 3] and fa.attrs["k_perm"] == [0, 2, 3, 1]
    assert fa.attrs["out_perm"] == [0, 2, 1, 3]
    assert fa.outputs == [opt.outputs[0].name] == ["y"]
    assert all(fa.inputs[4:])   # the three split shapes and the merge shape


def test_k_transposed_twice_folds_its_last_transpose_only():
    """K split to heads, then transposed again: only the last Transpose (and no Reshape)
    goes into the node; the head-split Transpose and Reshape stay."""
    opt = _compare(_model(k_perm=(0, 2, 1, 3)))
    fa = _attention(opt)
    assert fa.attrs["k_perm"] == [0, 1, 3, 2] and fa.inputs[5] == ""
    assert [n.op_type for n in opt.nodes].count("Transpose") == 1


@pytest.mark.parametrize("merge", ["transpose", "none"])
def test_partial_merge(merge):
    opt = _compare(_model(merge=merge, mask="none"))
    fa = _attention(opt)
    assert fa.inputs[7] == ""
    assert bool(fa.attrs.get("out_perm")) == (merge == "transpose")


def test_not_folded_when_a_head_value_is_an_output():
    """The Q heads are a graph output: their Transpose and Reshape stay, the rest folds."""
    opt = _compare(_model(extra_output="qh"))
    fa = _attention(opt)
    assert fa.inputs[0] == "qh" and not fa.attrs.get("q_perm")
    assert [n.op_type for n in opt.nodes].count("Transpose") == 1


def test_not_folded_when_the_merged_value_is_also_read_elsewhere():
    opt = _compare(_model(extra_output="ctx_t"))
    fa = _attention(opt)
    assert fa.outputs == ["ctx_t"] and fa.inputs[7] == ""
    assert "Reshape" in [n.op_type for n in opt.nodes]


def test_not_folded_with_allowzero():
    """A head-split Reshape with allowzero=1 (0 means an empty dimension) is not folded; the
    Transposes after it and the merge Reshape (no allowzero) are."""
    opt = _compare(_model(dynamic_shape=True, allowzero=1))
    fa = _attention(opt)
    assert not any(fa.inputs[4:7]) and fa.inputs[7] == "merge_shape"
    assert fa.attrs["q_perm"] == [0, 2, 1, 3]
    assert [n.op_type for n in opt.nodes].count("Reshape") == 3


def test_not_folded_when_one_value_feeds_two_inputs():
    """Q's heads are also V: the shared Transpose feeds two inputs and is not folded."""
    opt = _compare(_model(shared_q=True))
    fa = _attention(opt)
    assert fa.inputs[0] == fa.inputs[2] == "qh"


def test_kernel_layout_against_numpy_and_bad_shape():
    b, s = 2, 3
    q, k, v = (RNG.standard_normal((b, s, H * D)).astype(np.float32) for _ in range(3))
    shape = np.array([b, s, H, D], np.int64)
    qh = q.reshape(b, s, H, D).transpose(0, 2, 1, 3)
    kt = k.reshape(b, s, H, D).transpose(0, 2, 3, 1)
    vh = v.reshape(b, s, H, D).transpose(0, 2, 1, 3)
    sc = qh @ kt * np.float32(0.5)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    ref = ((e / e.sum(-1, keepdims=True)) @ vh).transpose(0, 2, 1, 3).reshape(b, s, H * D)
    got = fused_attention(q, k, v, None, shape, shape, shape, np.array([0, 0, -1], np.int64),
                          scale=0.5, scale_op="mul", q_perm=[0, 2, 1, 3], k_perm=[0, 2, 3, 1],
                          v_perm=[0, 2, 1, 3], out_perm=[0, 2, 1, 3])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match="Reshape"):
        fused_attention(q, k, v, None, np.array([b, s, 5, D], np.int64))
    with pytest.raises(ShapeError, match="Transpose"):
        fused_attention(q, k, v, None, shape, q_perm=[0, 1, 2])


@pytest.mark.parametrize("shape", [[2, 3, -2, 8], [2, 3, -1, -1], [2, 3, 4, 9], [2, 0, 4, 8]])
def test_kernel_layout_shape_rules_are_reshape_s(shape):
    """The node's split follows Reshape's rules (numpy's reshape would take -2 as unknown;
    0 copies the input dimension)."""
    q = RNG.standard_normal((2, 3, H * D)).astype(np.float32)
    sh = np.array(shape, np.int64)
    if shape[1] == 0:
        got = fused_attention(q, q, q, None, sh, sh, sh, q_perm=[0, 2, 1, 3],
                              k_perm=[0, 2, 3, 1], v_perm=[0, 2, 1, 3])
        assert got.shape == (2, 4, 3, 8)
    else:
        with pytest.raises(ShapeError, match="Reshape"):
            fused_attention(q, q, q, None, sh)


@pytest.mark.slow
@pytest.mark.parametrize("name,left", [("gpt2", {"Transpose": 0, "Reshape": 0}),
                                       ("bert", {"Transpose": 0, "Reshape": 2})])
def test_exported_transformers(name, left, torch_exports):
    """The PyTorch-exported BERT-like / GPT-2-like models: every head split folds (BERT keeps
    its merge Reshape: the merged context's shape is also read by a Shape node), and the
    optimised run matches the graph run as written."""
    from tests.helpers import torch_models
    from workbench import backend
    proto = torch_exports.proto(name)
    g = load(proto).graph
    opt = passes.optimize(g)
    ops = [n.op_type for n in opt.nodes]
    for op, count in left.items():
        assert ops.count(op) == count, (op, ops)
    for fa in (n for n in opt.nodes if n.op_type == "FusedAttention"):
        assert fa.attrs["q_perm"] and fa.attrs["k_perm"] and fa.attrs["v_perm"]
        assert all(fa.inputs[4:7])
    feeds = list(torch_models.example_inputs(name, 2, seq=7))
    got = backend.prepare(proto).run(feeds)
    plain = backend.prepare(proto, optimize=False).run(feeds)
    for a, b in zip(got, plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
