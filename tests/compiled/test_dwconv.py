"""The C kernel module ``dwconv_avx2`` (``kernels/dwconv_avx2.c``): the channels-last depthwise
3x3 convolution with its fused epilogue against the numpy path (the reference), every channel
tail, small and odd spatial sizes, strides, pads on every side, NaN/Inf, row ranges, and the
node's pre-bound call (kept, refreshed when the weights change, dropped when kernels are off);
the fallback without the module."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.compiled import cache
from workbench.ops import conv_nhwc
from workbench.ops.registry import FUSED_DOMAIN, NodeContext, lookup

RNG = np.random.default_rng(2311)
INF = np.inf
PADS = ([1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1],
        [2, 0, 1, 2])
EPILOGUES = (("", ()), ("Relu", ()), ("Clip", (0.0, 6.0)), ("Clip", (-0.5, 0.7)))


@pytest.fixture(scope="module")
def dw():
    why = compiled.c_unavailable("dwconv_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["dwconv_avx2"], timeout=300):
        pytest.skip(f"dwconv_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("dwconv_avx2.dw3x3")


def _conv(x, w, b=None, z=None, act="", params=(), stride=1, pads=(1, 1, 1, 1), ctx=None):
    return lookup("NhwcConv", FUSED_DOMAIN, 1).fn(
        x, w, b, z, activation=act, activation_params=list(params), group=x.shape[3],
        pads=list(pads), strides=[stride, stride], ctx=ctx)


def _numpy(*a, **k):
    with compiled.disabled():
        return _conv(*a, **k)


def _out(h, p0, p1, s):
    return (h + p0 + p1 - 3) // s + 1


def _case(n, c, h, w_, stride, pads, has_b, has_z):
    x = RNG.standard_normal((n, h, w_, c)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 1, c)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32) if has_b else None
    oh, ow = _out(h, pads[0], pads[2], stride), _out(w_, pads[1], pads[3], stride)
    z = RNG.standard_normal((n, oh, ow, c)).astype(np.float32) if has_z else None
    return x, w, b, z


def _calls(monkeypatch):
    """Counts the C path's calls."""
    calls = []
    real = conv_nhwc._depthwise_c
    monkeypatch.setattr(conv_nhwc, "_depthwise_c", lambda *a: calls.append(1) or real(*a))
    return calls


def test_every_channel_tail_size_stride_pad_and_epilogue(dw, monkeypatch):
    """C in {1, 7, 8, 9, 17, 24, 31, 32, 58} (every tail of the 8-lane blocks and of the
    32-channel tile: 1-4 blocks, the last masked or full),
    H and W in {1, 2, 3, 5, 8}, both strides, every pad pattern (asymmetric, and pads of 2
    where a whole kernel row falls outside), with and without bias and residual, no clip,
    ReLU, ReLU6, Clip: the same as numpy's path within float32 rounding."""
    calls = _calls(monkeypatch)
    i = n = 0
    for c in (1, 7, 8, 9, 17, 24, 31, 32, 58):
        for h in (1, 2, 3, 5, 8):
            for w_ in (1, 3, 8) if c in (1, 17) else (5, 2):
                i += 1
                stride, pads = 1 + i % 2, PADS[i % len(PADS)]
                if _out(h, pads[0], pads[2], stride) < 1 or _out(w_, pads[1], pads[3], stride) < 1:
                    pads = PADS[0]
                act, params = EPILOGUES[i % len(EPILOGUES)]
                x, w, b, z = _case(2, c, h, w_, stride, pads, i % 3 != 0, i % 4 == 1)
                got = _conv(x, w, b, z, act, params, stride, pads)
                want = _numpy(x, w, b, z, act, params, stride, pads)
                assert got.shape == want.shape and got.dtype == np.float32
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
                n += 1
    assert len(calls) == n


def test_nan_and_inf_propagate_like_numpy(dw):
    """NaN reaches exactly the outputs whose window sees it and passes the clip (numpy's clip
    keeps NaN); Inf next to the border does not leak through the padding (padded taps are
    skipped, never multiplied by zero)."""
    x, w, b, z = _case(2, 11, 6, 7, 1, PADS[0], True, True)
    x[0, 2, 3, 4] = np.nan
    x[1, 0, 0, 2] = INF
    x[1, 5, 6, 9] = -INF
    b[7] = INF
    z[0, 4, 4, 1] = np.nan
    for stride in (1, 2):
        zz = None if stride == 2 else z
        for act, params in EPILOGUES:
            with np.errstate(invalid="ignore"):
                want = _numpy(x, w, b, zz, act, params, stride)
            got = _conv(x, w, b, zz, act, params, stride)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            fin = np.isfinite(want)
            np.testing.assert_array_equal(got[~fin & ~np.isnan(want)],
                                          want[~fin & ~np.isnan(want)])
            np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


def test_empty_batch_and_empty_row_ranges(dw):
    x, w, b, _ = _case(0, 9, 5, 5, 1, PADS[0], True, False)
    assert _conv(x, w, b, act="Relu").shape == (0, 5, 5, 9)
    x, w, b, _ = _case(1, 9, 5, 5, 1, PADS[0], True, False)
    wp, bp = conv_nhwc.pack_depthwise(w, b)
    y = np.full((1, 5, 5, 9), 12345.0, np.float32)
    for r0, r1 in ((2, 2), (3, 1)):
        dw(conv_nhwc.dw_block(x, wp, bp, None, y, [1, 1], [1, 1], (5, 5), r0, r1, -INF, INF))
    assert (y == 12345.0).all()   # empty and reversed ranges write nothing


def test_row_ranges_split_the_work_exactly(dw, monkeypatch):
    """The engine's workers each take ranges of output rows (across images too): together
    the same as one call, bit for bit, and each range writes its rows only."""
    x, w, b, z = _case(3, 24, 20, 13, 1, PADS[0], True, True)
    wp, bp = conv_nhwc.pack_depthwise(w, b)

    def run(ranges):
        y = np.full((3, 20, 13, 24), 12345.0, np.float32)
        for r0, r1 in ranges:
            dw(conv_nhwc.dw_block(x, wp, bp, z, y, [1, 1], [1, 1], (20, 13), r0, r1, 0.0, 6.0))
        return y
    whole = run([(0, 60)])
    part = run([(17, 23)]).reshape(60, -1)
    assert (part[:17] == 12345.0).all() and (part[23:] == 12345.0).all()
    np.testing.assert_array_equal(part[17:23], whole.reshape(60, -1)[17:23])
    np.testing.assert_array_equal(run([(0, 7), (7, 19), (19, 41), (41, 60)]), whole)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")   # the node, split over a pool
    monkeypatch.setattr(conv_nhwc, "_split_min", lambda: 0)     # (this small a layer is not, else)
    x, w, b, _ = _case(4, 40, 40, 40, 2, PADS[0], True, False)
    assert len(conv_nhwc._row_jobs(4 * 20, 20 * 40)) > 3
    want = _numpy(x, w, b, None, "Clip", (0.0, 6.0), 2)
    ctx = NodeContext("n", "NhwcConv", 1, 1)
    for _ in range(3):   # the full path, then the pre-bound call, both split
        np.testing.assert_allclose(_conv(x, w, b, None, "Clip", (0.0, 6.0), 2, ctx=ctx), want,
                                   rtol=1e-5, atol=1e-5)
    assert conv_nhwc._BOUND in ctx.extra


def test_the_pre_bound_call_is_kept_and_follows_new_weights(dw):
    """A node's context keeps a pre-bound call from its second run with the same packed
    weights; weights or bias assigned in place, a new weight array, another input shape or
    compiled kernels turned off all give the new answer."""
    ctx = NodeContext("n", "NhwcConv", 1, 1)
    x, w, b, z = _case(2, 12, 7, 7, 1, PADS[0], True, True)
    args = dict(act="Clip", params=(0.0, 6.0), ctx=ctx)
    _conv(x, w, b, z, **args)
    assert conv_nhwc._BOUND not in ctx.extra
    _conv(x, w, b, z, **args)
    bound = ctx.extra[conv_nhwc._BOUND]
    np.testing.assert_allclose(_conv(x, w, b, z, **args), _numpy(x, w, b, z, "Clip", (0.0, 6.0)),
                               rtol=1e-5, atol=1e-5)
    assert ctx.extra[conv_nhwc._BOUND] is bound and bound(x, w, b, z) is not None
    w *= -1.0   # in place, as an optimizer step or a user's edit
    np.testing.assert_allclose(_conv(x, w, b, z, **args), _numpy(x, w, b, z, "Clip", (0.0, 6.0)),
                               rtol=1e-5, atol=1e-5)
    b[3] = -7.0   # the bias alone, in place: checked exactly
    np.testing.assert_allclose(_conv(x, w, b, z, **args), _numpy(x, w, b, z, "Clip", (0.0, 6.0)),
                               rtol=1e-5, atol=1e-5)
    w2 = np.ascontiguousarray(w * 0.5)
    np.testing.assert_allclose(_conv(x, w2, b, None, **args),
                               _numpy(x, w2, b, None, "Clip", (0.0, 6.0)), rtol=1e-5, atol=1e-5)
    x2 = x[:1].copy()
    np.testing.assert_allclose(_conv(x2, w2, b, None, **args),
                               _numpy(x2, w2, b, None, "Clip", (0.0, 6.0)), rtol=1e-5, atol=1e-5)
    with compiled.disabled():
        assert ctx.extra[conv_nhwc._BOUND](x2, w2, b, None) is None
        np.testing.assert_allclose(_conv(x2, w2, b, None, **args),
                                   _numpy(x2, w2, b, None, "Clip", (0.0, 6.0)), rtol=1e-5,
                                   atol=1e-5)


def test_the_1x1_pre_bound_call(dw):
    """The same pre-bound call for a 1x1 layer on ``gemm_avx2.gemm_block``."""
    if compiled.kernel("gemm_avx2.gemm_block") is None and not compiled.wait(["gemm_avx2"]):
        pytest.skip("gemm_avx2 is not available")
    ctx = NodeContext("n", "NhwcConv", 1, 1)
    x = RNG.standard_normal((2, 5, 3, 12)).astype(np.float32)
    w = RNG.standard_normal((1, 1, 12, 20)).astype(np.float32)
    b = RNG.standard_normal(20).astype(np.float32)
    z = RNG.standard_normal((2, 5, 3, 20)).astype(np.float32)
    f = lookup("NhwcConv", FUSED_DOMAIN, 1).fn
    run = lambda: f(x, w, b, z, activation="Relu", ctx=ctx)  # noqa: E731
    want = np.maximum(x.reshape(-1, 12) @ w.reshape(12, 20) + b + z.reshape(-1, 20), 0)
    run()
    run()
    assert conv_nhwc._BOUND in ctx.extra
    np.testing.assert_allclose(run().reshape(-1, 20), want, rtol=1e-5, atol=1e-5)
    w[0, 0, 5, :] += 1.0
    want = np.maximum(x.reshape(-1, 12) @ w.reshape(12, 20) + b + z.reshape(-1, 20), 0)
    np.testing.assert_allclose(run().reshape(-1, 20), want, rtol=1e-5, atol=1e-5)


def test_no_compiler_no_module(fresh_home, monkeypatch):
    """A fresh engine state without a compiler (``CC=nope``): the module is "unavailable"
    with a one-line reason and nothing is built; the same when the CPU lacks AVX2/FMA."""
    monkeypatch.setenv("CC", "nope")
    why = compiled.c_unavailable("dwconv_avx2")
    assert why and "no C compiler" in why and "CC=nope" in why and "\n" not in why
    assert compiled.kernel("dwconv_avx2.dw3x3") is None
    assert compiled.wait(["dwconv_avx2"], timeout=30) is False
    st = compiled.status()["modules"]["dwconv_avx2"]
    assert st["state"] == "unavailable" and "no C compiler" in st["why"]
    assert not compiled._PROCS
    monkeypatch.setattr(cache, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert "lacks avx2, fma" in compiled.c_unavailable("dwconv_avx2")


def test_the_layer_falls_back_without_the_module(monkeypatch):
    """Without the C kernel (not loaded: no compiler, another CPU) the depthwise layer runs
    on the numba kernel when it is loaded, else numpy; turned off, on numpy. The same
    answer either way."""
    real = compiled.kernel
    monkeypatch.setattr(conv_nhwc.compiled, "kernel",
                        lambda name: None if name.startswith("dwconv_avx2.") else real(name))
    calls = _calls(monkeypatch)
    ctx = NodeContext("n", "NhwcConv", 1, 1)
    x, w, b, _ = _case(2, 9, 6, 5, 2, PADS[2], True, False)
    want = _numpy(x, w, b, None, "Clip", (0.0, 6.0), 2, PADS[2])
    for _ in range(3):
        got = _conv(x, w, b, None, "Clip", (0.0, 6.0), 2, PADS[2], ctx=ctx)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not calls and conv_nhwc._BOUND not in ctx.extra
