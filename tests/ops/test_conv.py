"""Conv family kernels against naive loop references written here (and onnx.reference)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper

from workbench.errors import ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(0)


def run(op, *inputs, opset=22, n_outputs=1, **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


def reference(op, inputs, opset, n_outputs=1, **attrs):
    """onnx.reference as an oracle for one node (tests only)."""
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    outs = [f"o{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    feeds = {n: v for n, v in zip(names, inputs) if v is not None}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


# --------------------------------------------------------------------------------------------
# naive references
# --------------------------------------------------------------------------------------------

def naive_conv(x, w, b, strides, pads, dilations, group):
    N, C = x.shape[:2]
    M, Cg = w.shape[:2]
    ks = w.shape[2:]
    nd = len(ks)
    pb, pe = pads[:nd], pads[nd:]
    xpad = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + list(zip(pb, pe)))
    out = [(xpad.shape[2 + i] - ((ks[i] - 1) * dilations[i] + 1)) // strides[i] + 1
           for i in range(nd)]
    y = np.zeros((N, M, *out))
    Mg = M // group
    for m in range(M):
        g = m // Mg
        for c in range(Cg):
            for tap in itertools.product(*[range(k) for k in ks]):
                sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                           for t, d, o, s in zip(tap, dilations, out, strides))
                y[:, m] += xpad[(slice(None), g * Cg + c) + sl] * w[(m, c) + tap]
    if b is not None:
        y += b.reshape((1, M) + (1,) * nd)
    return y


def naive_conv_transpose(x, w, b, strides, pads, dilations, group, output_padding):
    """Scatter every input pixel times the kernel into the full output, then crop pads."""
    N, C = x.shape[:2]
    Mg = w.shape[1]
    M = Mg * group
    ks = w.shape[2:]
    nd = len(ks)
    ins = x.shape[2:]
    full = [strides[i] * (ins[i] - 1) + (ks[i] - 1) * dilations[i] + 1 + output_padding[i]
            for i in range(nd)]
    y = np.zeros((N, M, *full))
    Cg = C // group
    for n in range(N):
        for c in range(C):
            g = c // Cg
            for pos in itertools.product(*[range(i) for i in ins]):
                for tap in itertools.product(*[range(k) for k in ks]):
                    o = tuple(p * s + t * d for p, s, t, d in zip(pos, strides, tap, dilations))
                    for mg in range(Mg):
                        y[(n, g * Mg + mg) + o] += x[(n, c) + pos] * w[(c, mg) + tap]
    crop = tuple(slice(pads[i], full[i] - pads[nd + i]) for i in range(nd))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, M) + (1,) * nd)
    return y


# --------------------------------------------------------------------------------------------
# Conv
# --------------------------------------------------------------------------------------------

CONV_CASES = []
for nd in (1, 2, 3):
    for strides, dil, pads, group in itertools.product((1, 2), (1, 2), (0, 1, "asym"),
                                                      (1, 2)):
        CONV_CASES.append((nd, strides, dil, pads, group))


@pytest.mark.parametrize("nd,stride,dil,pads,group", CONV_CASES)
def test_conv_vs_naive(nd, stride, dil, pads, group):
    size = {1: 11, 2: 7, 3: 5}[nd]
    k = 3 if nd < 3 else 2
    x = RNG.standard_normal((2, 4) + (size,) * nd).astype(np.float32)
    w = RNG.standard_normal((6, 4 // group) + (k,) * nd).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    if pads == "asym":
        p = [1] * nd + [2] * nd
        p[0] = 0
    else:
        p = [pads] * (2 * nd)
    st, dl = [stride] * nd, [dil] * nd
    y = run("Conv", x, w, b, strides=st, dilations=dl, pads=p, group=group)
    ref = naive_conv(x, w, b, st, p, dl, group)
    assert y.dtype == np.float32 and y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,k,stride,pads", [
    ((3, 5, 9, 9), 1, 1, 0), ((3, 5, 9, 9), 1, 2, 0), ((2, 5, 8, 8), 1, 1, 1),
    ((9, 8, 4, 4), 3, 1, 1), ((9, 8, 4, 4), 1, 1, 0),  # small outputs: batch-merged GEMM
])
def test_conv_pointwise_and_merged(shape, k, stride, pads):
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((7, shape[1], k, k)).astype(np.float32)
    y = run("Conv", x, w, strides=[stride] * 2, pads=[pads] * 4)
    np.testing.assert_allclose(y, naive_conv(x, w, None, [stride] * 2, [pads] * 4, [1, 1], 1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride,dil,k,pads", [(1, 1, 3, 1), (2, 1, 3, 1), (1, 2, 3, 2),
                                                (2, 1, 5, 2), (1, 1, 3, 0)])
def test_conv_depthwise(stride, dil, k, pads):
    C = 6
    x = RNG.standard_normal((3, C, 13, 11)).astype(np.float32)
    w = RNG.standard_normal((C, 1, k, k)).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    y = run("Conv", x, w, b, group=C, strides=[stride] * 2, dilations=[dil] * 2,
            pads=[pads] * 4)
    ref = naive_conv(x, w, b, [stride] * 2, [pads] * 4, [dil] * 2, C)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,stride", [((3, 2, 160, 160), 1), ((3, 2, 161, 159), 2),
                                          ((2, 3, 9), 1), ((2, 3, 5, 6, 7), 2)])
def test_conv_depthwise_blocks_and_ranks(shape, stride):
    # big images take the one-image-block path; 1-D and 3-D use the same code
    nd = len(shape) - 2
    C = shape[1]
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((C, 1) + (3,) * nd).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    y = run("Conv", x, w, b, group=C, strides=[stride] * nd, pads=[1] * (2 * nd))
    ref = naive_conv(x, w, b, [stride] * nd, [1] * (2 * nd), [1] * nd, C)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_depthwise_channel_multiplier():
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 1, 3, 3)).astype(np.float32)
    y = run("Conv", x, w, group=3, pads=[1] * 4)
    np.testing.assert_allclose(y, naive_conv(x, w, None, [1, 1], [1] * 4, [1, 1], 3),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_auto_pad(auto_pad, stride):
    x = RNG.standard_normal((1, 2, 7, 8)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 4, 3)).astype(np.float32)
    y = run("Conv", x, w, auto_pad=auto_pad, strides=[stride] * 2)
    if auto_pad == "VALID":
        pads = [0] * 4
    else:
        pads_b, pads_e = [], []
        for i, k in zip((7, 8), (4, 3)):
            out = -(-i // stride)
            total = max(0, (out - 1) * stride + k - i)
            small, big = total // 2, total - total // 2
            pads_b.append(small if auto_pad == "SAME_UPPER" else big)
            pads_e.append(big if auto_pad == "SAME_UPPER" else small)
        pads = pads_b + pads_e
    ref = naive_conv(x, w, None, [stride] * 2, pads, [1, 1], 1)
    assert y.shape == ref.shape
    if auto_pad != "VALID":
        assert y.shape[2:] == (-(-7 // stride), -(-8 // stride))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_same_lower_matches_reference():
    x = RNG.standard_normal((1, 1, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 2, 2)).astype(np.float32)
    for ap in ("SAME_UPPER", "SAME_LOWER"):
        (ref,) = reference("Conv", [x, w], 11, auto_pad=ap)
        np.testing.assert_allclose(run("Conv", x, w, auto_pad=ap), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, "bfloat16"])
def test_conv_dtypes(dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = ml_dtypes.bfloat16
    x = RNG.standard_normal((2, 4, 6, 6)).astype(dtype)
    w = RNG.standard_normal((3, 4, 3, 3)).astype(dtype)
    y = run("Conv", x, w, pads=[1] * 4)
    assert y.dtype == np.dtype(dtype)
    ref = naive_conv(x.astype(np.float64), w.astype(np.float64), None, [1, 1], [1] * 4,
                     [1, 1], 1)
    tol = 1e-9 if dtype == np.float64 else 0.1
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=tol, atol=tol)


def test_conv_empty_batch_and_kernel_shape_attr():
    x = np.zeros((0, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    y = run("Conv", x, w, kernel_shape=[3, 3])
    assert y.shape == (0, 3, 3, 3)
    with pytest.raises(ShapeError, match="kernel_shape"):
        run("Conv", x, w, kernel_shape=[2, 2])


def test_conv_errors_name_the_problem():
    x = np.zeros((1, 3, 5, 5), np.float32)
    with pytest.raises(ShapeError, match="group"):
        run("Conv", x, np.zeros((4, 2, 3, 3), np.float32))
    with pytest.raises(ShapeError, match="larger than the padded input"):
        run("Conv", x, np.zeros((4, 3, 7, 7), np.float32))
    with pytest.raises(ShapeError, match="pads"):
        run("Conv", x, np.zeros((4, 3, 3, 3), np.float32), pads=[1, 1])


def test_conv_integer():
    x = RNG.integers(0, 255, (2, 3, 6, 6)).astype(np.uint8)
    w = RNG.integers(-128, 127, (4, 3, 3, 3)).astype(np.int8)
    xz = np.array(17, np.uint8)
    wz = np.array([1, -2, 3, 0], np.int8)
    y = run("ConvInteger", x, w, xz, wz, opset=10, pads=[1] * 4)
    # padding uses the zero point, i.e. zero after the shift
    xs = x.astype(np.int64) - 17
    ws = w.astype(np.int64) - wz.reshape(4, 1, 1, 1)
    ref = naive_conv(xs, ws, None, [1, 1], [1] * 4, [1, 1], 1)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref.astype(np.int64))
    y2 = run("ConvInteger", x, w, opset=10)
    ref2 = naive_conv(x.astype(np.int64), w.astype(np.int64), None, [1, 1], [0] * 4, [1, 1], 1)
    np.testing.assert_array_equal(y2, ref2.astype(np.int64))


# --------------------------------------------------------------------------------------------
# ConvTranspose
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nd,stride,dil,pads,group,outpad", [
    (2, 1, 1, 0, 1, 0), (2, 2, 1, 0, 1, 0), (2, 2, 1, 1, 1, 1), (2, 3, 2, 1, 2, 1),
    (1, 2, 1, 1, 1, 0), (3, 2, 1, 0, 2, 1), (2, 1, 2, 2, 1, 0),
])
def test_conv_transpose_vs_scatter(nd, stride, dil, pads, group, outpad):
    size = {1: 5, 2: 4, 3: 3}[nd]
    x = RNG.standard_normal((2, 4) + (size,) * nd).astype(np.float32)
    w = RNG.standard_normal((4, 3) + (3,) * nd).astype(np.float32)
    b = RNG.standard_normal(3 * group).astype(np.float32)
    st, dl, p, op_ = [stride] * nd, [dil] * nd, [pads] * (2 * nd), [outpad] * nd
    y = run("ConvTranspose", x, w, b, strides=st, dilations=dl, pads=p, group=group,
            output_padding=op_)
    ref = naive_conv_transpose(x, w, b, st, p, dl, group, op_)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [
    dict(strides=[3, 2], output_shape=[10, 8]),
    dict(strides=[3, 2], output_padding=[1, 1]),
    dict(strides=[3, 2], output_shape=[10, 8], kernel_shape=[3, 3], output_padding=[1, 1]),
    dict(strides=[3, 2], pads=[1, 2, 1, 2]),
    dict(dilations=[2, 2]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER", strides=[2, 2]),
])
def test_conv_transpose_attributes_vs_reference(attrs):
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    (ref,) = reference("ConvTranspose", [x, w], 22, **attrs)
    y = run("ConvTranspose", x, w, **attrs)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_output_shape_smaller_than_full():
    # total padding (0, 1): without SAME_UPPER the odd pixel is cropped at the start
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    full = naive_conv_transpose(x, w, None, [2, 2], [0] * 4, [1, 1], 1, [0, 0])  # 7x7
    y = run("ConvTranspose", x, w, strides=[2, 2], output_shape=[7, 6])
    np.testing.assert_allclose(y, full[:, :, :, 1:], rtol=1e-4, atol=1e-4)
    y = run("ConvTranspose", x, w, strides=[2, 2], output_shape=[1, 2, 7, 6])  # N, C given
    np.testing.assert_allclose(y, full[:, :, :, 1:], rtol=1e-4, atol=1e-4)


def test_conv_transpose_opset1_same_upper_pads_start():
    x = RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)
    y11 = run("ConvTranspose", x, w, opset=11, auto_pad="SAME_UPPER", strides=[2, 2])
    y1 = run("ConvTranspose", x, w, opset=7, auto_pad="SAME_UPPER", strides=[2, 2])
    full = naive_conv_transpose(x, w, None, [2, 2], [0] * 4, [1, 1], 1, [0, 0])  # 7x7
    np.testing.assert_allclose(y11, full[:, :, :6, :6], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y1, full[:, :, 1:, 1:], rtol=1e-5, atol=1e-5)


def test_col2im_vs_reference():
    x = RNG.standard_normal((2, 2 * 6, 12)).astype(np.float32)
    attrs = dict(strides=[1, 2], pads=[1, 0, 0, 1], dilations=[1, 1])
    image_shape = np.array([4, 7], np.int64)
    block_shape = np.array([2, 3], np.int64)
    # blocks: (4+1-2)//1+1 = 4, (7+1-3)//2+1 = 3 -> 12
    (ref,) = reference("Col2Im", [x, image_shape, block_shape], 18, **attrs)
    y = run("Col2Im", x, image_shape, block_shape, opset=18, **attrs)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="blocks"):
        run("Col2Im", x[:, :, :5], image_shape, block_shape, opset=18, **attrs)


def test_col2im_inverts_im2col_counts():
    # folding ones counts how many blocks cover every pixel
    ones = np.ones((1, 9, 9), np.float64)
    y = run("Col2Im", ones, np.array([5, 5]), np.array([3, 3]), opset=18)
    expect = np.outer([1, 2, 3, 2, 1], [1, 2, 3, 2, 1]).reshape(1, 1, 5, 5)
    np.testing.assert_array_equal(y, expect)


# --------------------------------------------------------------------------------------------
# DeformConv, CausalConvWithState
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_mask,offset_group,group,pads,stride", [
    (False, 1, 1, 0, 1), (True, 2, 1, 1, 1), (True, 1, 2, 1, 2), (False, 2, 2, 0, 1),
])
def test_deform_conv_vs_reference(with_mask, offset_group, group, pads, stride):
    x = RNG.standard_normal((2, 4, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((2, 4 // group, 2, 2)).astype(np.float32)
    b = RNG.standard_normal(2).astype(np.float32)
    oh = (5 + 2 * pads - 2) // stride + 1
    offset = (RNG.standard_normal((2, offset_group * 4 * 2, oh, oh)) * 1.5).astype(np.float32)
    mask = RNG.random((2, offset_group * 4, oh, oh)).astype(np.float32) if with_mask else None
    attrs = dict(offset_group=offset_group, group=group, pads=[pads] * 4,
                 strides=[stride] * 2)
    (ref,) = reference("DeformConv", [x, w, offset, b, mask], 19, **attrs)
    y = run("DeformConv", x, w, offset, b, mask, opset=19, **attrs)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_deform_conv_zero_offset_is_conv():
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    off = np.zeros((1, 18, 4, 4), np.float32)
    y = run("DeformConv", x, w, off, opset=19)
    np.testing.assert_allclose(y, run("Conv", x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias,past,act", [(False, False, "none"), (True, True, "silu"),
                                           (True, False, "swish"), (False, True, "none")])
def test_causal_conv_with_state(bias, past, act):
    if lookup("CausalConvWithState", "", 27) is None:  # pragma: no cover
        pytest.skip("no schema")
    x = RNG.standard_normal((2, 4, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 1, 4)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32) if bias else None
    p = RNG.standard_normal((2, 4, 3)).astype(np.float32) if past else None
    y, state = run("CausalConvWithState", x, w, b, p, opset=27, n_outputs=2, activation=act)
    full = np.concatenate([p if past else np.zeros((2, 4, 3), np.float32), x], axis=2)
    ref = np.zeros((2, 4, 8))
    for t in range(8):
        ref[:, :, t] = (full[:, :, t:t + 4] * w[:, 0]).sum(-1)
    if bias:
        ref += b.reshape(1, 4, 1)
    if act != "none":
        ref = ref / (1 + np.exp(-ref))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(state, full[:, :, -3:])


@pytest.mark.parametrize("threads", ["1", "3"])
def test_conv_paths_same_result_with_any_thread_count(monkeypatch, threads):
    # im2col (per image and batch-merged), 1x1, depthwise and grouped paths, threaded or not
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", threads)
    rng = np.random.default_rng(7)
    cases = [((4, 8, 30, 30), (16, 8, 3, 3), 1), ((6, 16, 10, 10), (32, 16, 3, 3), 1),
             ((4, 32, 30, 30), (64, 32, 1, 1), 1), ((4, 24, 40, 40), (24, 1, 3, 3), 24),
             ((4, 16, 20, 20), (32, 4, 3, 3), 4)]
    for xs, ws, g in cases:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        y = run("Conv", x, w, b, group=g, pads=[ws[2] // 2] * 4)
        ref = naive_conv(x, w, b, [1, 1], [ws[2] // 2] * 4, [1, 1], g)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-3)


# --------------------------------------------------------------------------------------------
# FusedConv: the epilogue applied piece by piece (in the GEMM/depthwise workers) must equal
# Conv, then Add, then the activation
_FUSED_CASES = [
    dict(x=(2, 3, 9, 8), w=(4, 3, 3, 3), pads=[1, 1, 1, 1]),                 # small, 1 call
    dict(x=(8, 16, 40, 40), w=(48, 16, 1, 1)),                                # batch split
    dict(x=(1, 32, 64, 64), w=(64, 32, 3, 3), pads=[1, 1, 1, 1]),             # column split
    dict(x=(4, 8, 12, 12), w=(8, 4, 3, 3), group=2, pads=[1, 1, 1, 1]),       # groups
    dict(x=(6, 24, 10, 10), w=(12, 24, 1, 1)),                                # merged (small)
    dict(x=(3, 16, 30, 30), w=(16, 1, 3, 3), group=16, pads=[1, 1, 1, 1]),    # depthwise
    dict(x=(2, 12, 33, 31), w=(12, 1, 3, 3), group=12, strides=[2, 2]),      # depthwise s2
    dict(x=(2, 4, 5, 6, 7), w=(6, 4, 3, 3, 3), pads=[1] * 6),                 # 3-D
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("act,params", [("Relu", []), ("Clip", [0.0, 6.0]),
                                        ("LeakyRelu", [0.1]), ("", [])])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("c", _FUSED_CASES, ids=[str(i) for i in range(len(_FUSED_CASES))])
def test_fused_conv_equals_conv_add_activation(c, residual, act, params, dtype):
    from workbench.ops.conv import apply_activation, conv, fused_conv
    if not act and not residual:
        pytest.skip("nothing fused")
    r = np.random.default_rng(11)
    X = r.standard_normal(c["x"]).astype(dtype)
    W = (r.standard_normal(c["w"]) * 0.3).astype(dtype)
    B = r.standard_normal(c["w"][0]).astype(dtype)
    kw = dict(group=c.get("group", 1), pads=c.get("pads"), strides=c.get("strides"))
    y = conv(X, W, B, **kw).astype(np.float32)
    Z = r.standard_normal(y.shape).astype(dtype) if residual else None
    if Z is not None:
        y = y + Z.astype(np.float32)
    want = apply_activation(y, act, *(params + [0.0, 0.0])[:2])
    got = fused_conv(X, W, B, Z, activation=act, activation_params=params, **kw)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol * 10)
