"""fuse_attention (workbench/graph/passes.py) and the FusedAttention kernel it creates
(workbench/ops/linalg.py): every fused graph against the same graph run unoptimised."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import InputError
from workbench.graph import passes
from workbench.graph.load import load
from workbench.ops.linalg import fused_attention
from workbench.runtime import Plan

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(scale="div", mask="add", softmax_axis=-1, extra_output=None, opset=17):
    """q, k, v (b, h, s, d); scores = q @ k^T [scaled] [masked]; softmax; @ v."""
    inits = [numpy_helper.from_array(np.array(4.0, np.float32), "c"),
             numpy_helper.from_array(np.array(-1e9, np.float32), "fill")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"])]
    cur = "s0"
    if scale == "div":
        nodes.append(helper.make_node("Div", [cur, "c"], ["s1"]))
        cur = "s1"
    elif scale == "mul_const_first":
        nodes.append(helper.make_node("Mul", ["c", cur], ["s1"]))
        cur = "s1"
    inputs = [helper.make_tensor_value_info(n, F, ["b", "h", "s", 8]) for n in "qkv"]
    if mask == "add":
        inputs.append(helper.make_tensor_value_info("m", F, ["b", 1, 1, "s"]))
        nodes.append(helper.make_node("Add", [cur, "m"], ["s2"]))
        cur = "s2"
    elif mask in ("where_true", "where_false"):
        inputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL, ["s", "s"]))
        args = ["m", "fill", cur] if mask == "where_true" else ["m", cur, "fill"]
        nodes.append(helper.make_node("Where", args, ["s2"]))
        cur = "s2"
    nodes.append(helper.make_node("Softmax", [cur], ["p"], axis=softmax_axis))
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    outs = [helper.make_tensor_value_info("y", F, ["b", "h", "s", 8])]
    if extra_output:
        outs.append(helper.make_tensor_value_info(extra_output, F, None))
        outs[-1].type.tensor_type.shape.dim.add().dim_param = "b"
    g = helper.make_graph(nodes, "attn", inputs, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(model, b=2, h=3, s=5):
    feeds = [RNG.standard_normal((b, h, s, 8)).astype(np.float32) for _ in range(3)]
    names = [i.name for i in model.graph.input]
    if "m" in names:
        if model.graph.input[3].type.tensor_type.elem_type == TensorProto.BOOL:
            feeds.append(np.triu(np.ones((s, s), bool), 1))
        else:
            m = np.zeros((b, 1, 1, s), np.float32)
            m[-1, ..., s // 2:] = -1e4   # the last row padded at the end
            feeds.append(m)
    return feeds


def _compare(model, expect_fused, **kw):
    g = load(model).graph
    feeds = _feeds(model, **kw)
    plain = Plan(g).run(feeds)
    opt = passes.optimize(g)
    ops = [n.op_type for n in opt.nodes]
    assert ("FusedAttention" in ops) == expect_fused, ops
    got = Plan(opt).run(feeds)
    for a, b in zip(got, plain):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return ops


@pytest.mark.parametrize("scale", ["div", "mul_const_first", "none"])
@pytest.mark.parametrize("mask", ["add", "where_true", "where_false", "none"])
@pytest.mark.parametrize("b,h,s", [(1, 1, 1), (2, 3, 5), (1, 2, 7)])
def test_fused_matches_unfused(scale, mask, b, h, s):
    ops = _compare(_model(scale, mask), True, b=b, h=h, s=s)
    assert "Softmax" not in ops and ops.count("MatMul") == 0


def test_not_fused_softmax_on_another_axis():
    _compare(_model(softmax_axis=2), False)


def test_not_fused_when_the_scores_are_an_output():
    ops = _compare(_model(extra_output="p"), False)
    assert "Softmax" in ops


def test_not_fused_before_opset_13():
    """Softmax-1..12 normalises the flattened tail, not the last axis alone."""
    ops = _compare(_model(mask="none", opset=12), False)
    assert "Softmax" in ops


def test_kernel_against_numpy_and_bad_attributes():
    q, k, v = (RNG.standard_normal((2, 4, 6)).astype(np.float32) for _ in range(3))
    kt = k.transpose(0, 2, 1)
    cond = np.tril(np.ones((4, 4), bool))
    s = q @ kt * np.float32(0.5)
    s = np.where(cond, s, np.float32(-1e9))
    e = np.exp(s - s.max(-1, keepdims=True))
    ref = (e / e.sum(-1, keepdims=True)) @ v
    got = fused_attention(q, kt, v, cond, scale=0.5, scale_op="mul", mask="fill_where_false",
                          fill=-1e9)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError):
        fused_attention(q, kt, v, scale_op="pow")
    with pytest.raises(InputError):
        fused_attention(q.astype(np.int64), kt.astype(np.int64), v)


def test_a_variable_scale_is_not_baked_in():
    """A trainable model's inference graph (``optimize(variables=...)``) reads no variable's
    value: with the scale a variable the attention is left unfused (its value may change)."""
    g = load(_model("div", "none")).graph
    assert "FusedAttention" in [n.op_type for n in passes.optimize(g).nodes]
    ops = [n.op_type for n in passes.optimize(g, variables={"c"}).nodes]
    assert "FusedAttention" not in ops and "Div" in ops
