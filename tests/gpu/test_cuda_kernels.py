"""Each CUDA kernel against the portable numpy path (same inputs, tolerance per dtype).

Every test runs twice: ``emulated`` compiles the kernels' CUDA C with g++ and runs it on the
CPU through a numpy stand-in for cupy (``tests/gpu/emulation.py``; checks index math, argument
order, geometry and the override/fallback logic - always runs where g++ exists), and ``cuda``
on the real GPU (skipped cleanly without cupy and a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu import emulation
from tests.gpu.conftest import TOL, cuda_skip_reason
from workbench.arrays.cuda import conv as cconv
from workbench.arrays.cuda import pool as cpool
from workbench.arrays.cuda import softmax as csm
from workbench.arrays.cuda.elementwise import fuse_elementwise
from workbench.ops import cuda as ov
from workbench.ops.registry import NodeContext, portable

R = np.random.default_rng(7)


class Impl:
    def __init__(self, name, put, get):
        self.name, self.put, self.get = name, put, get


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def impl(request, monkeypatch):
    if request.param == "emulated":
        if emulation.GXX is None:
            pytest.skip("g++ is not installed (needed to emulate the CUDA kernels)")
        emulation.install(monkeypatch)
        return Impl("emulated", lambda a: a if a is None else np.ascontiguousarray(a),
                    np.asarray)
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    import cupy as cp
    return Impl("cuda", lambda a: None if a is None else cp.asarray(a), cp.asnumpy)


@pytest.fixture
def strict(monkeypatch):
    """Fail if an override falls back to the portable kernel (the CUDA path must run)."""
    def no_fallback(*a, **k):
        raise AssertionError(f"override fell back to the portable kernel: {a}")
    monkeypatch.setattr(ov, "portable", no_fallback)


def rnd(*shape, dtype="float32"):
    return R.standard_normal(shape).astype(dtype)


def close(got, want, dtype, scale=1.0):
    rtol, atol = TOL[np.dtype(dtype).name]
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(scale, 1.0))


DTYPES = ["float32", "float16"]

# ----------------------------------------------------------------------------- Conv
CONV = [
    dict(x=(2, 3, 9, 8), w=(4, 3, 3, 3), pads=[1, 1, 1, 1]),
    dict(x=(2, 4, 11, 10), w=(6, 4, 3, 2), pads=[0, 1, 2, 0], strides=[2, 3], dilations=[2, 1]),
    dict(x=(1, 4, 7, 7), w=(6, 2, 3, 3), group=2, pads=[1, 1, 1, 1], bias=True),
    dict(x=(2, 4, 8, 9), w=(8, 1, 3, 3), group=4, pads=[1, 0, 1, 2], strides=[2, 1],
         bias=True),                                            # depthwise, multiplier 2
    dict(x=(2, 5, 6, 6), w=(3, 5, 1, 1), bias=True),            # pointwise
    dict(x=(1, 2, 10, 7), w=(3, 2, 4, 3), auto_pad="SAME_UPPER", strides=[3, 2]),
    dict(x=(1, 2, 10, 7), w=(3, 2, 4, 3), auto_pad="SAME_LOWER", strides=[2, 2]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CONV, ids=[str(i) for i in range(len(CONV))])
def test_conv(impl, strict, c, dtype):
    X, W = rnd(*c["x"], dtype=dtype), rnd(*c["w"], dtype=dtype)
    B = rnd(c["w"][0], dtype=dtype) if c.get("bias") else None
    kw = dict(auto_pad=c.get("auto_pad", "NOTSET"), dilations=c.get("dilations"),
              group=c.get("group", 1), kernel_shape=None, pads=c.get("pads"),
              strides=c.get("strides"))
    want = portable("Conv", 17)(X, W, B, **kw)
    got = impl.get(ov.conv_cuda(impl.put(X), impl.put(W), impl.put(B), **kw))
    assert got.dtype == X.dtype
    close(got, want, dtype, scale=np.sqrt(np.prod(c["w"][1:])))


FUSED = [("Relu", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.7]), ("Sigmoid", []),
         ("HardSigmoid", [0.2, 0.5]), ("Tanh", []), ("", [])]


@pytest.mark.parametrize("residual", [False, True], ids=["act", "add-act"])
@pytest.mark.parametrize("act,params", FUSED, ids=[a or "none" for a, _ in FUSED])
@pytest.mark.parametrize("c", [CONV[0], CONV[2], CONV[3], CONV[4]],
                         ids=["3x3", "groups", "depthwise", "pointwise"])
def test_fused_conv_epilogue(impl, strict, c, act, params, residual):
    """FusedConv (Conv + residual + activation in the GEMM epilogue) against the portable
    FusedConv; float32."""
    if not residual and not act:
        pytest.skip("nothing to fuse")
    X, W = rnd(*c["x"]), rnd(*c["w"])
    B = rnd(c["w"][0]) if c.get("bias") else None
    kw = dict(auto_pad=c.get("auto_pad", "NOTSET"), dilations=c.get("dilations"),
              group=c.get("group", 1), kernel_shape=None, pads=c.get("pads"),
              strides=c.get("strides"))
    y0 = portable("Conv", 17)(X, W, B, **kw)
    Z = rnd(*y0.shape) if residual else None
    want = portable("FusedConv", 1, "com.workbench")(
        X, W, B, Z, activation=act, activation_params=params, **kw)
    got = impl.get(ov.fused_conv_cuda(impl.put(X), impl.put(W), impl.put(B), impl.put(Z),
                                      activation=act, activation_params=params, **kw))
    close(got, want, "float32", scale=np.sqrt(np.prod(c["w"][1:])))


def test_conv_in_batch_chunks(impl, strict, monkeypatch):
    monkeypatch.setattr(cconv, "COLS_BUDGET_BYTES", 2 * 3 * 9 * 64 * 4)   # 2 images a chunk
    X, W = rnd(5, 3, 8, 8), rnd(4, 3, 3, 3)
    kw = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
              pads=[1, 1, 1, 1], strides=None)
    close(impl.get(ov.conv_cuda(impl.put(X), impl.put(W), None, **kw)),
          portable("Conv", 17)(X, W, None, **kw), "float32", 6)


def test_conv_falls_back_for_3d_and_float64(impl):
    X, W = rnd(1, 2, 4, 4, 4), rnd(3, 2, 2, 2, 2)
    kw = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
              strides=None)
    close(impl.get(ov.conv_cuda(impl.put(X), impl.put(W), None, **kw)),
          portable("Conv", 17)(X, W, None, **kw), "float32", 4)
    X, W = rnd(1, 2, 5, 5, dtype="float64"), rnd(3, 2, 3, 3, dtype="float64")
    close(impl.get(ov.conv_cuda(impl.put(X), impl.put(W), None, **kw)),
          portable("Conv", 17)(X, W, None, **kw), "float64", 4)


CONVT = [
    dict(x=(2, 3, 5, 4), w=(3, 2, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(x=(1, 4, 4, 5), w=(4, 3, 3, 2), group=2, strides=[2, 3], pads=[0, 1, 1, 0],
         output_padding=[1, 2], dilations=[1, 2], bias=True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CONVT, ids=["plain", "groups-outpad-dil"])
def test_conv_transpose(impl, strict, c, dtype):
    X, W = rnd(*c["x"], dtype=dtype), rnd(*c["w"], dtype=dtype)
    B = rnd(c["w"][1] * c.get("group", 1), dtype=dtype) if c.get("bias") else None
    kw = dict(auto_pad="NOTSET", dilations=c.get("dilations"), group=c.get("group", 1),
              kernel_shape=None, output_padding=c.get("output_padding"), output_shape=None,
              pads=c.get("pads"), strides=c.get("strides"))
    want = portable("ConvTranspose", 17)(X, W, B, **kw)
    got = impl.get(ov.conv_transpose_cuda(impl.put(X), impl.put(W), impl.put(B), **kw))
    close(got, want, dtype, scale=3)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_backward_is_the_adjoint(impl, group):
    """<conv(x), dy> == <x, d_data(dy)> == <w, d_weight(dy)>: checks col2im and the GEMMs."""
    x, w = rnd(2, 4, 7, 6), rnd(6, 4 // group, 3, 2)
    geo = dict(strides=(2, 1), pads=(1, 0, 0, 1), dilations=(1, 2), group=group)
    y = impl.get(cconv.conv2d(impl.put(x), impl.put(w), None, **geo))
    dy = rnd(*y.shape)
    dx = impl.get(cconv.conv2d_backward_data(impl.put(dy), impl.put(w), x.shape, **geo))
    dw = impl.get(cconv.conv2d_backward_weight(impl.put(dy), impl.put(x), w.shape, **geo))
    lhs = float((y.astype(np.float64) * dy).sum())
    assert abs(lhs - float((x.astype(np.float64) * dx).sum())) < 1e-3 * max(1, abs(lhs))
    assert abs(lhs - float((w.astype(np.float64) * dw).sum())) < 1e-3 * max(1, abs(lhs))


# ----------------------------------------------------------------------------- pools
POOLS = [
    dict(ks=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(ks=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], dilations=[2, 1]),
    dict(ks=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=1),
    dict(ks=[2, 2], strides=[2, 2], pads=None, auto_pad="SAME_UPPER"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", POOLS, ids=[str(i) for i in range(len(POOLS))])
def test_maxpool(impl, strict, p, dtype):
    X = rnd(2, 3, 9, 8, dtype=dtype)
    kw = dict(auto_pad=p.get("auto_pad", "NOTSET"), ceil_mode=p.get("ceil_mode", 0),
              dilations=p.get("dilations"), kernel_shape=p["ks"], pads=p["pads"],
              storage_order=0, strides=p["strides"])
    want = portable("MaxPool", 12)(X, ctx=None, **kw)
    got = impl.get(ov.max_pool_cuda(impl.put(X), ctx=None, **kw))
    close(got, want, dtype)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", POOLS, ids=[str(i) for i in range(len(POOLS))])
def test_avgpool(impl, strict, p, dtype, include_pad):
    X = rnd(2, 3, 9, 8, dtype=dtype)
    kw = dict(auto_pad=p.get("auto_pad", "NOTSET"), ceil_mode=p.get("ceil_mode", 0),
              count_include_pad=include_pad, dilations=p.get("dilations"),
              kernel_shape=p["ks"], pads=p["pads"], strides=p["strides"])
    want = portable("AveragePool", 19)(X, **kw)
    got = impl.get(ov.average_pool_cuda(impl.put(X), **kw))
    close(got, want, dtype)


def test_maxpool_backward_routes_to_the_argmax(impl):
    x = (R.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) / 50.0).astype(np.float32)
    ks, st, pb, dl = [3, 2], [2, 1], [1, 0], [1, 2]
    pb_, _, out = cpool.pool_geometry(x.shape[2:], ks, st, dl, pb + [1, 1], "NOTSET", 0)
    y, am = cpool.maxpool2d(impl.put(x), ks, st, pb_, dl, out, return_argmax=True)
    y, am = impl.get(y), impl.get(am)
    dy = rnd(*y.shape)
    dx = impl.get(cpool.maxpool2d_backward(impl.put(dy), impl.put(am), x.shape, ks, st, pb_,
                                           dl))
    want = np.zeros(x.shape, np.float64)
    flat = want.reshape(2 * 3, -1)
    for p in range(6):
        np.add.at(flat[p], am.reshape(6, -1)[p], dy.reshape(6, -1)[p])
    # the argmax really is the position of the maximum
    np.testing.assert_array_equal(np.take_along_axis(x.reshape(6, -1), am.reshape(6, -1), 1),
                                  y.reshape(6, -1))
    close(dx, want, "float32")


@pytest.mark.parametrize("include_pad", [False, True])
def test_avgpool_backward_is_the_adjoint(impl, include_pad):
    x = rnd(2, 2, 9, 7)
    ks, st, dl = [3, 2], [2, 2], [1, 2]
    pb, pe, out = cpool.pool_geometry(x.shape[2:], ks, st, dl, [1, 0, 1, 1], "NOTSET", 1)
    y = impl.get(cpool.avgpool2d(impl.put(x), ks, st, pb, pe, dl, out,
                                 count_include_pad=include_pad))
    dy = rnd(*y.shape)
    dx = impl.get(cpool.avgpool2d_backward(impl.put(dy), x.shape, ks, st, pb, pe, dl,
                                           count_include_pad=include_pad))
    a = float((y.astype(np.float64) * dy).sum())
    b = float((x.astype(np.float64) * dx).sum())
    assert abs(a - b) < 1e-4 * max(1.0, abs(a))


# ----------------------------------------------------------------------------- norms
def _ctx(n, training=False):
    return NodeContext("n", "X", 17, n, training=training)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batchnorm_inference_and_fused_relu(impl, strict, dtype):
    from workbench.arrays.cuda import norm as cnorm
    X = rnd(2, 3, 5, 4, dtype=dtype)
    s, b, m = rnd(3, dtype=dtype), rnd(3, dtype=dtype), rnd(3, dtype=dtype)
    v = (R.uniform(0.5, 2, 3)).astype(dtype)
    want = portable("BatchNormalization", 15)(X, s, b, m, v, epsilon=1e-5, momentum=0.9,
                                              training_mode=0, ctx=_ctx(1))
    got = impl.get(ov.batch_norm_cuda(*map(impl.put, (X, s, b, m, v)), epsilon=1e-5,
                                      momentum=0.9, training_mode=0, ctx=_ctx(1)))
    close(got, want, dtype, 3)
    fused = impl.get(cnorm.batchnorm_inference(*map(impl.put, (X, s, b, m, v)), 1e-5,
                                               relu=True))
    close(fused, np.maximum(want, 0), dtype, 3)


@pytest.mark.parametrize("opset", [9, 15])
@pytest.mark.parametrize("dtype", DTYPES)
def test_batchnorm_training(impl, strict, dtype, opset):
    X = rnd(4, 3, 5, 6, dtype=dtype) * 2 + 1
    s, b, m = rnd(3, dtype=dtype), rnd(3, dtype=dtype), rnd(3, dtype=dtype)
    v = (R.uniform(0.5, 2, 3)).astype(dtype)
    args = (X, s, b, m, v)
    if opset == 9:
        want = portable("BatchNormalization", 9)(*args, epsilon=1e-5, momentum=0.9,
                                                 ctx=_ctx(5))
        got = ov.batch_norm_9_cuda(*map(impl.put, args), epsilon=1e-5, momentum=0.9,
                                   ctx=_ctx(5))
    else:
        want = portable("BatchNormalization", 15)(*args, epsilon=1e-5, momentum=0.9,
                                                  training_mode=1, ctx=_ctx(3))
        got = ov.batch_norm_cuda(*map(impl.put, args), epsilon=1e-5, momentum=0.9,
                                 training_mode=1, ctx=_ctx(3))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert impl.get(g).dtype == w.dtype
        close(impl.get(g), w, dtype, 3)


@pytest.mark.parametrize("axis,n_out", [(-1, 1), (1, 3), (2, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm(impl, strict, dtype, axis, n_out):
    X = rnd(3, 4, 37, dtype=dtype) * 3 + 0.5
    shape = X.shape[axis:]
    S, B = rnd(*shape, dtype=dtype), rnd(*shape, dtype=dtype)
    want = portable("LayerNormalization", 17)(X, S, B, axis=axis, epsilon=1e-5, stash_type=1,
                                              ctx=_ctx(n_out))
    got = ov.layer_norm_cuda(impl.put(X), impl.put(S), impl.put(B), axis=axis, epsilon=1e-5,
                             stash_type=1, ctx=_ctx(n_out))
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert impl.get(g).dtype == w.dtype and impl.get(g).shape == w.shape
        close(impl.get(g), w, dtype, 3)


# ----------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 1000), (4, 1), (2, 2, 2)])
def test_softmax_last_axis(impl, strict, shape, dtype, log):
    X = (rnd(*shape) * 20).astype(dtype)             # large values: needs the max shift
    op = "LogSoftmax" if log else "Softmax"
    want = portable(op, 13)(X, axis=-1)
    from workbench.ops.registry import lookup
    fn = lookup(op, "", 13, xp="cupy").fn
    close(impl.get(fn(impl.put(X), axis=-1)), want, dtype, 20 if log else 1)


def test_softmax_other_axis_falls_back(impl):
    from workbench.ops.registry import lookup
    X = rnd(3, 4, 5)
    fn = lookup("Softmax", "", 13, xp="cupy").fn
    close(impl.get(fn(impl.put(X), axis=1)), portable("Softmax", 13)(X, axis=1), "float32")


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore", [None, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_cross_entropy(impl, strict, reduction, ignore, dtype):
    X = (rnd(6, 7) * 3).astype(dtype)
    y = np.array([0, 2, 6, 3, 2, 1], np.int64)
    want = portable("SoftmaxCrossEntropyLoss", 13)(X, y, None, reduction=reduction,
                                                   ignore_index=ignore, ctx=_ctx(2))
    got = ov.softmax_cross_entropy_loss_cuda(impl.put(X), impl.put(y), None,
                                             reduction=reduction, ignore_index=ignore,
                                             ctx=_ctx(2))
    for g, w in zip(got, want):
        close(impl.get(g), w, dtype, 10)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore", [None, 1])
def test_softmax_cross_entropy_backward(impl, reduction, ignore):
    X = rnd(5, 4).astype(np.float64)
    y = np.array([0, 1, 3, 1, 2], np.int64)
    dl = rnd(5) if reduction == "none" else np.float32(0.7)
    got = impl.get(csm.softmax_cross_entropy_backward(
        impl.put(X.astype(np.float32)), impl.put(y), impl.put(np.asarray(dl)),
        reduction=reduction, ignore_index=ignore))
    p = np.exp(X - X.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    onehot = np.eye(4)[y]
    keep = np.ones(5) if ignore is None else (y != ignore).astype(np.float64)
    if reduction == "none":
        scale = np.asarray(dl, np.float64) * keep
    elif reduction == "sum":
        scale = float(dl) * keep
    else:
        scale = float(dl) / keep.sum() * keep
    close(got, (p - onehot) * scale[:, None], "float32")


# ----------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(impl, strict, dtype, approximate):
    X = (rnd(4, 33) * 3).astype(dtype)
    close(impl.get(ov.gelu_cuda(impl.put(X), approximate=approximate)),
          portable("Gelu", 20)(X, approximate=approximate), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_erf(impl, strict, dtype):
    X = (rnd(5, 17) * 2).astype(dtype)
    close(impl.get(ov.erf_cuda(impl.put(X))), portable("Erf", 13)(X), dtype)


def test_fused_chain(impl):
    x, b, s = rnd(3, 8), rnd(8), rnd(3, 1)
    k = fuse_elementwise([("Add", 1), "Relu", ("Mul", 2), ("LeakyRelu", {"alpha": 0.1}),
                          "Sigmoid", ("RSub", 1)])
    got = impl.get(k(impl.put(x), impl.put(b), impl.put(s)))
    v = np.maximum(x + b, 0) * s
    v = np.where(v >= 0, v, 0.1 * v)
    v = 1 / (1 + np.exp(-v))
    close(got, b - v, "float32")
