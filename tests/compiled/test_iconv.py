"""The indirect-GEMM convolution of ``gemm_avx2`` (``gemm_avx2.iconv``): group-1 KxK
channels-last convolutions against the numpy path (im2col + BLAS, the reference): every
tile tail, small and large channel counts, strides, padding on each side, dilation, the
epilogues, NaN/Inf, row ranges, empty batches, a plan, and the numpy fallback."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench import backend, compiled
from workbench.arrays.geometry import window_geometry
from workbench.compiled import cache
from workbench.ops import conv_nhwc
from workbench.ops.registry import FUSED_DOMAIN, NodeContext, lookup

RNG = np.random.default_rng(2323)
INF = np.inf


@pytest.fixture(scope="module")
def iconv():
    why = compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["gemm_avx2"], timeout=300):
        pytest.skip(f"gemm_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("gemm_avx2.iconv")


@pytest.fixture(autouse=True)
def _no_fewc(monkeypatch):
    """Few-channel layers (stems) go to ``dwconv_avx2.fewc`` when it is loaded
    (tests/compiled/test_fewc.py): here they take this kernel's path, as without it."""
    monkeypatch.setattr(conv_nhwc, "_FEWC_MAX", 0)


def _conv(x, w, b=None, z=None, act="", params=(), strides=(1, 1), pads=(0, 0, 0, 0),
          dilations=(1, 1), ctx=None):
    return lookup("NhwcConv", FUSED_DOMAIN, 1).fn(
        x, w, b, z, activation=act, activation_params=list(params), strides=list(strides),
        pads=list(pads), dilations=list(dilations), ctx=ctx)


def _numpy(*args, **kw):
    with compiled.disabled():
        return _conv(*args, **kw)


def _close(got, want, K):
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, K ** 0.5))


def _data(N, H, W, C, kh, kw, M, has_b=True):
    x = RNG.standard_normal((N, H, W, C)).astype(np.float32)
    w = RNG.standard_normal((kh, kw, C, M)).astype(np.float32)
    b = RNG.standard_normal(M).astype(np.float32) if has_b else None
    return x, w, b


def test_every_tile_tail_and_epilogue(iconv, monkeypatch):
    """Output pixels 1..7 and 13 (every row tail, whole 6-pixel tiles, tiles running into
    the next image), columns ending a 16-column panel anywhere (1..40), C in {1, 3, 5, 17};
    with and without bias and residual; no activation, ReLU, Clip, LeakyRelu, Sigmoid."""
    calls = []
    run = conv_nhwc._indirect
    monkeypatch.setattr(conv_nhwc, "_indirect", lambda *a: calls.append(run(*a)) or calls[-1])
    epilogues = [("", (), False, True), ("Relu", (), True, False), ("Clip", (0.0, 6.0), True,
                                                                    True),
                 ("Clip", (-1.5, 0.5), False, False), ("LeakyRelu", (0.1,), True, True),
                 ("Sigmoid", (), False, True)]   # no clip: applied after the kernel
    # (N, H, W): 3x3, pad 1 keeps H x W; pixels per batch N*H*W
    grids = [(1, 1, 1), (1, 1, 2), (1, 1, 3), (2, 2, 1), (1, 1, 5), (2, 1, 3), (1, 7, 1),
             (1, 13, 1), (3, 2, 2)]
    i, seen = 0, []
    for n, h, w_ in grids:
        for C in (1, 3, 5, 17):
            M = (1, 5, 8, 9, 16, 17, 24, 33, 40)[i % 9]
            act, params, has_b, has_z = epilogues[i % len(epilogues)]
            i += 1
            seen.append((C, M))
            x, w, b = _data(n, h, w_, C, 3, 3, M, has_b)
            z = RNG.standard_normal((n, h, w_, M)).astype(np.float32) if has_z else None
            kw = dict(act=act, params=params, pads=(1, 1, 1, 1))
            _close(_conv(x, w, b, z, **kw), _numpy(x, w, b, z, **kw), 9 * C)
    # the compiled path ran for each (C = M = 1 is a depthwise convolution: not its path),
    # and declined with the kernels off
    depthwise = sum(C == M == 1 for C, M in seen)
    assert calls.count(True) == i - depthwise and calls.count(False) == i - depthwise


@pytest.mark.parametrize("k, strides, pads, dilations", [
    ((3, 3), (2, 2), (1, 0, 0, 2), (1, 1)),    # stride 2, pads on some sides only
    ((3, 2), (1, 2), (0, 2, 1, 0), (2, 2)),    # rectangular, dilation 2, asymmetric pads
    ((2, 3), (2, 1), (2, 1, 2, 1), (1, 2)),
    ((7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),    # a 7x7 stem on a small image
    ((1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),    # ResNet's strided 1x1 downsample
    ((1, 1), (1, 1), (1, 0, 1, 2), (1, 1)),    # a padded 1x1
])
def test_strides_pads_and_dilations(iconv, k, strides, pads, dilations):
    for C, M, (N, H, W) in ((3, 19, (2, 11, 9)), (5, 8, (1, 13, 14)), (17, 40, (1, 6, 7))):
        x, w, b = _data(N, H, W, C, *k, M)
        kw = dict(act="Relu", strides=strides, pads=pads, dilations=dilations)
        _close(_conv(x, w, b, **kw), _numpy(x, w, b, **kw), k[0] * k[1] * C)


def test_large_channels_take_several_k_blocks(iconv):
    """C = 300 (taps in several blocks, partial sums kept in Y between them) and C = 800
    (one tap per block), with a residual and a clip: the epilogue once, at the end."""
    for C, M, H in ((300, 21, 5), (800, 18, 3)):
        x, w, b = _data(1, H, H + 1, C, 3, 3, M)
        z = RNG.standard_normal((1, H, H + 1, M)).astype(np.float32)
        kw = dict(act="Clip", params=(-2.0, 3.0), pads=(1, 1, 1, 1))
        _close(_conv(x, w, b, z, **kw), _numpy(x, w, b, z, **kw), 9 * C)


def _raw(k, x, w, b, z, kh, kw, S, D, pads, lo, hi, ranges):
    N, H, W, C = x.shape
    M = w.shape[-1]
    pb, _pe, out, _ = window_geometry("t", (H, W), (kh, kw), list(S), list(D), list(pads),
                                      "NOTSET")
    ind = conv_nhwc.indirection(H, W, C, kh, kw, S, D, pb, out)
    wp, bp = conv_nhwc.pack_panels(w.reshape(-1, M), b)
    y = np.full((N * out[0] * out[1], M), 12345.0, np.float32)
    zero = np.zeros(C, np.float32)
    for r0, r1 in ranges:
        k(x, ind, zero, wp, bp, y if z is None else z, y, C, kh * kw, M, out[0] * out[1],
          H * W * C, r0, r1, int(z is not None), lo, hi)
    return y


def test_row_ranges_split_the_work_exactly(iconv):
    """Ranges as the engine's workers take them (any pixel, across images): each writes its
    rows only, together the same as one call, bit for bit; empty ranges write nothing."""
    x, w, b = _data(3, 5, 4, 7, 3, 3, 26)
    z = RNG.standard_normal((3 * 3 * 2, 26)).astype(np.float32)
    a = (iconv, x, w, b, z, 3, 3, (2, 2), (1, 1), (1, 1, 1, 0), 0.0, 6.0)
    whole = _raw(*a, [(0, 18)])
    part = _raw(*a, [(5, 11), (3, 3), (9, 2)])
    assert (part[:5] == 12345.0).all() and (part[11:] == 12345.0).all()
    np.testing.assert_array_equal(part[5:11], whole[5:11])
    np.testing.assert_array_equal(_raw(*a, [(0, 1), (1, 8), (8, 18)]), whole)


def test_prefetching_tiles_change_no_bits(iconv):
    """The first tile of each range, panel and tap block prefetches the next slice of the
    packed weights (the next panel's, then the next tap block's): several panels (M = 40) and
    one tap per block (C = 800), cut into ranges whose first tiles differ, give one call's bits
    and the numpy path's values."""
    x, w, b = _data(1, 3, 4, 800, 3, 3, 40)
    z = RNG.standard_normal((12, 40)).astype(np.float32)
    a = (iconv, x, w, b, z, 3, 3, (1, 1), (1, 1), (1, 1, 1, 1), -INF, INF)
    whole = _raw(*a, [(0, 12)])
    np.testing.assert_array_equal(_raw(*a, [(0, 1), (1, 7), (7, 12)]), whole)
    np.testing.assert_array_equal(_raw(*a, [(0, 5), (5, 12)]), whole)
    _close(whole.reshape(1, 3, 4, 40), _numpy(x, w, b, z.reshape(1, 3, 4, 40),
                                              pads=(1, 1, 1, 1)), 9 * 800)


def test_the_engines_workers_split_the_pixels(iconv, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    x, w, b = _data(2, 17, 9, 6, 3, 3, 20)
    kw = dict(act="Relu", pads=(1, 1, 1, 1))
    _close(_conv(x, w, b, **kw), _numpy(x, w, b, **kw), 54)


def test_nan_and_inf_propagate_like_numpy(iconv):
    """NaN in an input pixel reaches every output whose window reads it (and the clip keeps
    it); Inf in the input, the bias or the residual as numpy's path gives it; padding reads
    zeros, so 0 * an infinite weight is NaN in both paths."""
    x, w, b = _data(1, 6, 5, 4, 3, 3, 11)
    z = RNG.standard_normal((1, 6, 5, 11)).astype(np.float32)
    x[0, 2, 3, 1] = np.nan
    x[0, 5, 0, 2] = INF
    b[7] = -INF
    z[0, 1, 1, 3] = INF
    w[0, 0, 3, 9] = INF   # the top-left tap: reads padding for the first output row
    for act, params in (("", ()), ("Clip", (0.0, 6.0)), ("Relu", ())):
        kw = dict(act=act, params=params, pads=(1, 1, 1, 1))
        with np.errstate(invalid="ignore", over="ignore"):
            want = _numpy(x, w, b, z, **kw)
            got = _conv(x, w, b, z, **kw)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        inf = np.isinf(want)
        np.testing.assert_array_equal(got[inf], want[inf])
        ok = np.isfinite(want)
        _close(got[ok], want[ok], 36)


def test_empty_batch_and_the_kept_tables(iconv):
    x, w, b = _data(0, 5, 5, 3, 3, 3, 8)
    assert _conv(x, w, b, pads=(1, 1, 1, 1)).shape == (0, 5, 5, 8)
    pads = (1, 1, 1, 1)
    for C, taps in ((9, 9), (3, 3)):   # fewer than 8 channels: a kernel row is one tap
        ctx = NodeContext("n", "NhwcConv", 1, 1)
        x, w, b = _data(2, 6, 6, C, 3, 3, 8)
        y1 = _conv(x, w, b, pads=pads, ctx=ctx)
        table = ctx.extra["gemm_avx2_ind"][1]
        assert table.shape == (36, taps)
        x2 = RNG.standard_normal((5, 6, 6, C)).astype(np.float32)   # another batch: same
        _close(_conv(x2, w, b, pads=pads, ctx=ctx), _numpy(x2, w, b, pads=pads), 9 * C)
        assert ctx.extra["gemm_avx2_ind"][1] is table
        x3 = RNG.standard_normal((1, 9, 4, C)).astype(np.float32)   # another size: rebuilt
        _close(_conv(x3, w, b, pads=pads, ctx=ctx), _numpy(x3, w, b, pads=pads), 9 * C)
        assert ctx.extra["gemm_avx2_ind"][1].shape == (9 * 4, taps)
        np.testing.assert_array_equal(_conv(x, w, b, pads=pads, ctx=ctx), y1)


def _resnet_block():
    """A 7x7/2 stem + ReLU, MaxPool, a 3x3 + ReLU, a 3x3 + residual + ReLU, a strided 3x3
    with a strided 1x1 downsample, GlobalAveragePool and Gemm: a ResNet in miniature."""
    def t(shape, name):
        return numpy_helper.from_array(
            (RNG.standard_normal(shape) * 0.2).astype(np.float32), name)
    c, d = 12, 20
    inits = [t((c, 3, 7, 7), "w0"), t((c,), "b0"), t((c, c, 3, 3), "w1"), t((c,), "b1"),
             t((c, c, 3, 3), "w2"), t((c,), "b2"), t((d, c, 3, 3), "w3"), t((d,), "b3"),
             t((d, c, 1, 1), "w4"), t((d,), "b4"), t((5, d), "fc"), t((5,), "fb")]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["s"], pads=[3, 3, 3, 3], strides=[2, 2]),
        helper.make_node("Relu", ["s"], ["s1"]),
        helper.make_node("MaxPool", ["s1"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "p"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Conv", ["r2", "w4", "b4"], ["c4"], strides=[2, 2]),
        helper.make_node("Add", ["c3", "c4"], ["a3"]),
        helper.make_node("Relu", ["a3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
    ]
    g = helper.make_graph(
        nodes, "resnetish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 29, 27])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_channels_last_resnet_agrees_with_the_plain_path(iconv, monkeypatch):
    model = _resnet_block()
    x = RNG.standard_normal((2, 3, 29, 27)).astype(np.float32)
    rep = backend.prepare(model)   # "auto": channels-last, since the kernel is ready
    assert sum(n.op_type == "NhwcConv" for n in rep.plan.graph.nodes) == 5
    with compiled.disabled():   # not ready at prepare: the network stays NCHW
        assert not any(n.op_type == "NhwcConv"
                       for n in backend.prepare(model).plan.graph.nodes)
    calls = []
    run = conv_nhwc._indirect
    monkeypatch.setattr(conv_nhwc, "_indirect", lambda *a: calls.append(1) or run(*a))
    got = [np.asarray(rep.run([x])[0]) for _ in range(2)]
    assert len(calls) == 10   # every convolution, both runs
    np.testing.assert_array_equal(got[0], got[1])
    with compiled.disabled():
        nhwc_numpy = np.asarray(rep.run([x])[0])
        plain = np.asarray(backend.prepare(model, layout=None).run([x])[0])
    for want in (nhwc_numpy, plain):
        np.testing.assert_allclose(got[1], want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_numpy_fallback_when_disabled_or_unavailable(fresh_home, monkeypatch):
    """Off, or without a compiler (``CC=nope``): no kernel, NhwcConv gives numpy's answer."""
    x, w, b = _data(1, 5, 6, 3, 3, 3, 10)
    kw = dict(act="Relu", pads=(1, 1, 1, 1))
    with compiled.disabled():
        want = np.maximum(0, np.asarray(backend.prepare(_one_conv(w, b), layout=None).run(
            [np.ascontiguousarray(x.transpose(0, 3, 1, 2))])[0]).transpose(0, 2, 3, 1))
        assert compiled.kernel("gemm_avx2.iconv") is None
        _close(_conv(x, w, b, **kw), want, 27)
    monkeypatch.setenv("CC", "nope")
    monkeypatch.setattr(cache, "compiler", lambda: None)
    # the numba modules NhwcConv also asks for are not built into this empty home either
    monkeypatch.setattr(compiled, "_builder", lambda *a, **k: [sys.executable, "-c", "pass"])
    compiled._forget()
    assert "no C compiler" in compiled.c_unavailable("gemm_avx2")
    assert compiled.kernel("gemm_avx2.iconv") is None
    _close(_conv(x, w, b, **kw), want, 27)


def _one_conv(w, b):
    kh, kw_, C, M = w.shape
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", C, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", M, "H", "W"])],
        [numpy_helper.from_array(np.ascontiguousarray(w.transpose(3, 2, 0, 1)), "w"),
         numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_weights_are_packed_from_any_view():
    """A trainable plan's HWIO weights are a view of its OIHW ones: packed in place, panel by
    panel, they give the panels of the contiguous (taps*C, M) matrix, zeros past M."""
    for M in (5, 16, 37):
        oihw = RNG.standard_normal((M, 7, 3, 2)).astype(np.float32)
        view = oihw.transpose(2, 3, 1, 0)
        b = RNG.standard_normal(M).astype(np.float32)
        got = conv_nhwc.pack_panels(view, b)
        want = conv_nhwc.pack_panels(np.ascontiguousarray(view).reshape(-1, M), b)
        for g, w in zip(got, want):
            assert g.flags.c_contiguous
            np.testing.assert_array_equal(g, w)
