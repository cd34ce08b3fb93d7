"""ShuffleNet-style blocks: the channel Concat written shuffled on the channels-last path
(NhwcConcatShuffle + a pass-through NhwcChannelShuffle), and the graph's shape arithmetic
folded when the model is prepared for given input shapes (``prepare(batch_size=...)``), both
against the model run as written, at one batch and then another."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import helper, numpy_helper

from workbench import backend
from workbench.errors import ShapeError
from workbench.ops.registry import FUSED_DOMAIN, lookup

from .models import make_model, vi

RNG = np.random.default_rng(23)


def _t(a, name):
    return numpy_helper.from_array(np.asarray(a), name)


def shuffle_block(c0: int, k: int, cb: int, g: int):
    """Depthwise 3x3 on x (N, c0, 6, 5); its channels split by two Slices at ``k``; the second
    part through a 1x1 conv to ``cb`` channels + Relu; Concat(first part, branch); a channel
    shuffle over ``g`` groups whose shapes are computed in the graph as torch.onnx exports
    them (Shape -> Gather -> Div -> Unsqueeze -> Concat); a 1x1 conv after it."""
    c = k + cb
    inits = [_t(RNG.standard_normal((c0, 1, 3, 3)).astype(np.float32), "wdw"),
             _t(RNG.standard_normal((cb, c0 - k, 1, 1)).astype(np.float32), "wb"),
             _t(RNG.standard_normal((4, c, 1, 1)).astype(np.float32), "wo"),
             _t(np.array([0], np.int64), "s0"), _t(np.array([k], np.int64), "sk"),
             _t(np.array([c0], np.int64), "sc"), _t(np.array([1], np.int64), "ax1"),
             _t(np.array([0], np.int64), "u0"), _t(np.array(g, np.int64), "gs"),
             _t(np.array([g], np.int64), "g1"), _t(np.array([-1], np.int64), "m1")]
    nodes = [
        helper.make_node("Conv", ["x", "wdw"], ["a"], name="dw", group=c0, pads=[1, 1, 1, 1]),
        helper.make_node("Slice", ["a", "s0", "sk", "ax1"], ["x1"], name="split_a"),
        helper.make_node("Slice", ["a", "sk", "sc", "ax1"], ["x2"], name="split_b"),
        helper.make_node("Conv", ["x2", "wb"], ["b0"], name="branch"),
        helper.make_node("Relu", ["b0"], ["b"], name="branch_relu"),
        helper.make_node("Concat", ["x1", "b"], ["c"], name="cat", axis=1),
        helper.make_node("Shape", ["c"], ["sh"], name="shape"),
    ]
    for i, d in enumerate("nchw"):
        inits.append(_t(np.array(i, np.int64), f"i_{d}"))
        nodes.append(helper.make_node("Gather", ["sh", f"i_{d}"], [f"dim_{d}"], name=f"g_{d}",
                                      axis=0))
    nodes.append(helper.make_node("Div", ["dim_c", "gs"], ["dim_cg"], name="per_group"))
    for d in ("n", "cg", "h", "w"):
        nodes.append(helper.make_node("Unsqueeze", [f"dim_{d}", "u0"], [d + "_u"],
                                      name=f"u_{d}"))
    nodes += [
        helper.make_node("Concat", ["n_u", "g1", "cg_u", "h_u", "w_u"], ["shape5"],
                         name="shape5", axis=0),
        helper.make_node("Concat", ["n_u", "m1", "h_u", "w_u"], ["shape4"], name="shape4",
                         axis=0),
        helper.make_node("Reshape", ["c", "shape5"], ["r5"], name="view"),
        helper.make_node("Transpose", ["r5"], ["t5"], name="swap", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "shape4"], ["y"], name="unview"),
        helper.make_node("Conv", ["y", "wo"], ["out"], name="after"),
    ]
    return make_model(nodes, [vi("x", ["N", c0, 6, 5])], [vi("out", ["N", 4, 6, 5])], inits)


def _kinds(rep):
    return collections.Counter(st.node.op_type for st in rep.plan.steps)


@pytest.mark.parametrize("c0,k,cb,g", [(9, 5, 5, 2), (7, 4, 5, 3)])
def test_shuffle_block_channels_last_and_folded(c0, k, cb, g):
    """groups 2 (C = 10: 5 channels per group) and 3 (C = 9, groups crossing the Concat's
    inputs); batch 1 then 3 on the same prepared models."""
    model = shuffle_block(c0, k, cb, g)
    ref = backend.prepare(model, layout=None)
    nhwc = backend.prepare(model)
    fixed = backend.prepare(model, batch_size=1)
    kinds = _kinds(nhwc)
    assert kinds["NhwcConcatShuffle"] == 1 and kinds["NhwcChannelShuffle"] == 1
    assert "Concat" in kinds            # the shape arithmetic's, kept with a dynamic batch
    shuffle = next(st for st in nhwc.plan.steps if st.node.op_type == "NhwcChannelShuffle")
    assert shuffle.attrs["shuffled"] == g
    fixed_kinds = _kinds(fixed)
    assert not {"Shape", "Gather", "Unsqueeze", "Div", "Concat"} & set(fixed_kinds)
    # constant shapes: the shuffle is known at prepare, the written concat is its result
    assert fixed_kinds["NhwcConcatShuffle"] == 1 and "NhwcChannelShuffle" not in fixed_kinds
    assert len(fixed.plan.steps) < len(nhwc.plan.steps)
    for batch in (1, 3, 1):
        x = RNG.standard_normal((batch, c0, 6, 5)).astype(np.float32)
        want = ref.run(x)[0]
        for rep in (nhwc, fixed):
            got = rep.run(x)[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fixed._general_rep is not None     # batch 3 ran the model as written


def test_given_shapes_are_checked_by_the_model_as_written():
    """A plan prepared for batch 2 fed an image of another size: the model as written
    refuses it by name (no wrong answer from the folded shapes)."""
    rep = backend.prepare(shuffle_block(9, 5, 5, 2), batch_size=2)
    with pytest.raises(ShapeError, match=r"input 'x' expects shape \[N, 9, 6, 5\]"):
        rep.run(np.zeros((2, 9, 7, 5), np.float32))


def _fused(op):
    return lookup(op, FUSED_DOMAIN, 1).fn


def _reference(pieces, s5, s4):
    """Concat (NCHW) -> Reshape(s5) -> Transpose(0, 2, 1, 3, 4) -> Reshape(s4), channels-last."""
    c = np.concatenate([p.transpose(0, 3, 1, 2) for p in pieces], axis=1)
    return c.reshape(s5).transpose(0, 2, 1, 3, 4).reshape(s4).transpose(0, 2, 3, 1)


@pytest.mark.parametrize("channels,pre,g", [
    ((5, 5), 2, 2),          # the written shuffle is the graph's: handed on as it is
    ((4, 5), 3, 3),          # groups crossing the inputs
    ((3, 4, 5), 3, 3),       # three inputs
    ((4, 5), 3, 9),          # the graph asks for another group count: undone, then redone
    ((5, 5), 2, 5),
    ((4, 5), 2, 3),          # 9 channels do not split in 2: written as a plain concat
    ((6, 6), 2, 1)])         # a shuffle over one group is the identity
def test_concat_shuffle_kernel(channels, pre, g):
    n, h, w = 2, 3, 4
    base = RNG.standard_normal((n, h, w, channels[0] + 3)).astype(np.float32)
    pieces = [base[..., 1:1 + channels[0]]]     # a strided view, as a Slice leaves it
    pieces += [RNG.standard_normal((n, h, w, c)).astype(np.float32) for c in channels[1:]]
    C = sum(channels)
    s5, s4 = [n, g, C // g, h, w], [n, C, h, w]
    y = _fused("NhwcConcatShuffle")(*pieces, groups=pre)
    got = _fused("NhwcChannelShuffle")(y, np.array(s5), np.array(s4), shuffled=pre)
    np.testing.assert_array_equal(got, _reference(pieces, s5, s4))


def test_concat_shuffle_kernel_not_a_shuffle_and_bad_inputs():
    a = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    b = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    y = _fused("NhwcConcatShuffle")(a, b, groups=2)
    s5, s4 = [1, 2, 4, 12, 1], [1, 8, 12, 1]    # reshapes that move spatial data around
    got = _fused("NhwcChannelShuffle")(y, np.array(s5), np.array(s4), shuffled=2)
    np.testing.assert_array_equal(got, _reference([a, b], s5, s4))
    with pytest.raises(ShapeError, match="NhwcConcatShuffle"):
        _fused("NhwcConcatShuffle")(a, b[:, :1], groups=2)


def test_channel_shuffle_remembers_its_checks_per_shapes():
    """A node's remembered shape checks (its context) never answer for other shapes."""
    from workbench.ops.registry import NodeContext
    ctx = NodeContext("shuffle", "NhwcChannelShuffle", 1, 1)
    a = RNG.standard_normal((1, 2, 3, 6)).astype(np.float32)
    for g, b in ((2, a), (3, a), (2, a), (2, a[:, :, :1])):
        n, h, w, c = b.shape
        s5, s4 = [n, g, c // g, h, w], [n, c, h, w]
        got = _fused("NhwcChannelShuffle")(b, np.array(s5), np.array(s4), ctx=ctx)
        np.testing.assert_array_equal(got, _reference([b], s5, s4))
    assert len(ctx.extra["shuffle_plans"]) == 3
