"""Channels-last kernels (NhwcConv, the Nhwc pools, NhwcChannelShuffle) against the NCHW
kernels they stand for, on the numpy path and on the compiled kernels (each test runs both)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.errors import ShapeError
from workbench.ops.registry import FUSED_DOMAIN, lookup
from workbench.ops.shape import _target_shape

RNG = np.random.default_rng(7)


@pytest.fixture(params=["numpy", "compiled"])
def path(request):
    """Each test once on the numpy path and once with the compiled kernels (when they are
    loaded: numba installed, Linux x86-64)."""
    if request.param == "numpy":
        with compiled.disabled():
            yield "numpy"
        return
    if not compiled.wait(["conv_nhwc"], timeout=900):
        pytest.skip(f"compiled kernels unavailable: {compiled.status()['modules']}")
    assert compiled.kernel("conv_nhwc.dw_k3s1") is not None   # the path really is compiled
    yield "compiled"


def fused(op):
    return lookup(op, FUSED_DOMAIN, 1).fn


def nchw_fused_conv(x, w, b, z=None, activation="", params=(), **attrs):
    return lookup("FusedConv", FUSED_DOMAIN, 1).fn(
        x, w, b, z, activation=activation, activation_params=list(params), **attrs)


def nhwc_conv(x, w, b, z=None, activation="", params=(), **attrs):
    """NhwcConv on NCHW data: converts in and out (the test's own conversions)."""
    y = fused("NhwcConv")(
        np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
        np.ascontiguousarray(w.transpose(2, 3, 1, 0)), b,
        None if z is None else np.ascontiguousarray(z.transpose(0, 2, 3, 1)),
        activation=activation, activation_params=list(params), **attrs)
    return y.transpose(0, 3, 1, 2)


def check(x, w, b, z=None, activation="", params=(), rtol=2e-5, **attrs):
    ref = nchw_fused_conv(x, w, b, z, activation, params, **attrs)
    got = nhwc_conv(x, w, b, z, activation, params, **attrs)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    scale = max(1.0, float(np.abs(ref.astype(np.float64)).max(initial=0)))
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=0,
                               atol=rtol * scale)


def data(n, c, h, w, m, k, group=1, dtype=np.float32):
    x = RNG.standard_normal((n, c, h, w)).astype(dtype)
    wt = RNG.standard_normal((m, c // group, *k)).astype(dtype)
    b = RNG.standard_normal(m).astype(dtype)
    return x, wt, b


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 0, 0), (2, 1, 0, 2)])
def test_depthwise(path, k, stride, pads):
    c = 19   # not a multiple of the vector width
    x, w, b = data(2, c, 11, 13, c, (k, k), group=c)
    check(x, w, b, group=c, strides=[stride, stride], pads=list(pads))


@pytest.mark.parametrize("activation,params", [("", ()), ("Relu", ()), ("Clip", (0.0, 6.0)),
                                               ("LeakyRelu", (0.1,)), ("Sigmoid", ())])
@pytest.mark.parametrize("residual", [False, True])
def test_depthwise_epilogue(path, activation, params, residual):
    c = 32
    x, w, b = data(3, c, 9, 9, c, (3, 3), group=c)
    z = RNG.standard_normal((3, c, 9, 9)).astype(np.float32) if residual else None
    check(x, w, b, z, activation, params, group=c, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("n,c,h,w", [(3, 1, 5, 5), (2, 7, 1, 9), (1, 8, 9, 1), (5, 3, 2, 2),
                                     (1, 33, 17, 3)])
def test_depthwise_odd_shapes(path, n, c, h, w):
    """One channel, one-pixel rows and columns, images smaller than the kernel, many images
    per block of rows (the compiled kernel's row ranges cross image borders)."""
    for k, s in ((3, 1), (3, 2), (5, 1), (5, 2)):
        x, wt, b = data(n, c, h, w, c, (k, k), group=c)
        p = k // 2
        check(x, wt, b, None, "Clip", (0.0, 6.0), group=c, strides=[s, s], pads=[p, p, p, p])


def test_depthwise_dilation_and_asymmetric_strides(path):
    c = 8
    x, w, b = data(1, c, 15, 12, c, (3, 3), group=c)
    check(x, w, b, group=c, pads=[2, 2, 2, 2], dilations=[2, 2])
    check(x, w, b, group=c, pads=[1, 1, 1, 1], strides=[2, 1])
    x, w, b = data(1, c, 10, 10, c, (3, 5), group=c)
    check(x, w, None, group=c, pads=[1, 2, 1, 2])


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 1, 0, 0)])
def test_pointwise(path, stride, pads):
    x, w, b = data(2, 24, 14, 9, 40, (1, 1))
    check(x, w, b, strides=[stride, stride], pads=list(pads))
    z = RNG.standard_normal(nchw_fused_conv(x, w, b, strides=[stride, stride],
                                            pads=list(pads)).shape).astype(np.float32)
    check(x, w, b, z, "Clip", (0.0, 6.0), strides=[stride, stride], pads=list(pads))


@pytest.mark.parametrize("k,stride,dil,group", [((3, 3), 1, 1, 1), ((3, 3), 2, 1, 1),
                                                ((7, 7), 2, 1, 1), ((3, 3), 1, 2, 1),
                                                ((3, 3), 1, 1, 4), ((1, 1), 1, 1, 2),
                                                ((2, 3), 1, 1, 2)])
def test_general(path, k, stride, dil, group):
    x, w, b = data(2, 8, 12, 10, 12, k, group=group)
    check(x, w, b, None, "Relu", (), strides=[stride, stride], dilations=[dil, dil],
          group=group, pads=[1, 1, 1, 1])


def test_channel_multiplier_is_a_grouped_conv(path):
    x, w, b = data(1, 4, 8, 8, 8, (3, 3), group=4)   # 2 outputs per input channel
    check(x, w, b, group=4, pads=[1, 1, 1, 1])


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_dtypes(path, dtype):
    x, w, b = data(1, 6, 7, 7, 6, (3, 3), group=6, dtype=dtype)
    check(x, w, b, group=6, pads=[1, 1, 1, 1], rtol=2e-3 if dtype == np.float16 else 1e-12)
    x, w, b = data(1, 6, 7, 7, 5, (1, 1), dtype=dtype)
    check(x, w, b, rtol=2e-3 if dtype == np.float16 else 1e-12)


def test_bfloat16(path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, w, b = data(1, 6, 7, 7, 6, (3, 3), group=6)
    bf = ml_dtypes.bfloat16
    check(x.astype(bf), w.astype(bf), b.astype(bf), group=6, pads=[1, 1, 1, 1], rtol=2e-2)


def test_empty_and_broadcast_residual(path):
    x, w, b = data(0, 6, 7, 7, 6, (3, 3), group=6)
    assert nhwc_conv(x, w, b, group=6, pads=[1, 1, 1, 1]).shape == (0, 6, 7, 7)
    x, w, b = data(2, 6, 7, 7, 6, (3, 3), group=6)
    z = RNG.standard_normal((1, 6, 1, 1)).astype(np.float32)   # broadcasts
    check(x, w, b, z, "Relu", (), group=6, pads=[1, 1, 1, 1])


def test_nan_and_inf_propagate_through_the_clip(path):
    c = 16
    x, w, b = data(1, c, 6, 6, c, (3, 3), group=c)
    x[0, 3, 2, 2] = np.nan
    x[0, 5, 4, 4] = np.inf
    ref = nchw_fused_conv(x, w, b, None, "Clip", (0.0, 6.0), group=c, pads=[1, 1, 1, 1])
    got = nhwc_conv(x, w, b, None, "Clip", (0.0, 6.0), group=c, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], atol=1e-5)


def test_pointwise_epilogue_nan_empty_and_thread_split(path, monkeypatch):
    """1x1: the one-pass epilogue (bias + residual + clip) keeps NaN and clips Inf like
    numpy; an empty batch; rows split over several workers give the same result."""
    x, w, b = data(2, 12, 5, 7, 20, (1, 1))
    x[0, 3, 2, 2] = np.nan
    x[1, 5, 4, 4] = np.inf
    z = RNG.standard_normal((2, 20, 5, 7)).astype(np.float32)
    z[1, 0, 0, 0] = -np.inf
    ref = nchw_fused_conv(x, w, b, z, "Clip", (0.0, 6.0))
    got = nhwc_conv(x, w, b, z, "Clip", (0.0, 6.0))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], atol=1e-5)
    x0, w0, b0 = data(0, 12, 5, 7, 20, (1, 1))
    assert nhwc_conv(x0, w0, b0, None, "Relu").shape == (0, 20, 5, 7)
    x, w, b = data(3, 16, 9, 9, 24, (1, 1))
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    monkeypatch.setattr("workbench.ops.conv_nhwc._BLOCK", 24 * 7)   # many small blocks
    check(x, w, b, None, "Relu")


def test_errors_name_the_problem():
    x = np.zeros((1, 4, 4, 6), np.float32)
    with pytest.raises(ShapeError, match="W.shape\\[2\\] \\* group == C"):
        fused("NhwcConv")(x, np.zeros((3, 3, 2, 6), np.float32), group=1)
    with pytest.raises(ShapeError, match="must be \\(N, H, W, C\\)"):
        fused("NhwcConv")(x[0], np.zeros((3, 3, 6, 6), np.float32))
    with pytest.raises(ShapeError, match="bias B must have shape \\(6,\\)"):
        fused("NhwcConv")(x, np.zeros((1, 1, 6, 6), np.float32), np.zeros(3, np.float32))


# ------------------------------------------------------------------------------ pools
@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 1], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                     "count_include_pad": 1}),
    ("GlobalAveragePool", {}), ("GlobalMaxPool", {})])
def test_pools(op, attrs):
    x = RNG.standard_normal((2, 5, 11, 9)).astype(np.float32)
    ref = lookup(op, "", 19).fn(x, **({"ctx": None} if op == "MaxPool" else {}), **attrs)
    got = fused("Nhwc" + op)(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), **attrs)
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2), ref, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ shuffle
def _shuffle_nchw(x, s5, s4):
    return x.reshape(s5).transpose(0, 2, 1, 3, 4).reshape(s4)


@pytest.mark.parametrize("s5,s4", [
    ([2, 2, -1, 5, 6], [2, -1, 5, 6]),     # the exporter's form: -1 inferred
    ([0, 4, 3, 5, 6], [0, 12, 5, 6]),       # 0 copies the dim
    ([2, 3, 4, 5, 6], [2, 12, 5, 6]),
    ([2, 2, 6, 30, 1], [2, 12, 30, 1])])   # not a channel shuffle: computed as written
def test_channel_shuffle(s5, s4):
    x = RNG.standard_normal((2, 12, 5, 6)).astype(np.float32)
    t5 = _target_shape(x.shape, s5, False)
    want = _shuffle_nchw(x, t5, _target_shape((t5[0], t5[2], t5[1], t5[3], t5[4]), s4, False))
    got = fused("NhwcChannelShuffle")(np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
                                      np.array(s5), np.array(s4))
    np.testing.assert_array_equal(got, want.transpose(0, 2, 3, 1))


def test_channel_shuffle_refuses_bad_shapes():
    x = np.zeros((1, 4, 4, 8), np.float32)
    with pytest.raises(ShapeError, match="5 dimensions"):
        fused("NhwcChannelShuffle")(x, np.array([1, 8, 4, 4]), np.array([1, 8, 4, 4]))
    with pytest.raises(ShapeError, match="cannot reshape"):
        fused("NhwcChannelShuffle")(x, np.array([1, 3, -1, 4, 4]), np.array([1, 8, 4, 4]))
