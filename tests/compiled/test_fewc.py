"""``dwconv_avx2.fewc``: NhwcConv with at most 4 input channels (a network's stem), read in
place through the input's strides, against the numpy path: kernel sizes, strides, pads (a
window wholly in the padding included), every channel tail and block of the output, residual
and clip, NaN/Inf (a padded tap is a zero: 0 * Inf is NaN as numpy's), strided and reversed
views, row ranges over the pool bit for bit; when it is not used."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.ops import conv_nhwc
from workbench.ops.registry import FUSED_DOMAIN, lookup

RNG = np.random.default_rng(2324)


@pytest.fixture(scope="module")
def fewc():
    why = compiled.c_unavailable("dwconv_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["dwconv_avx2"], timeout=300):
        pytest.skip(f"dwconv_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("dwconv_avx2.fewc")


@pytest.fixture(autouse=True)
def _any_stem(monkeypatch, request):
    """The kernel takes any kernel size and output width; the dispatch sends it only the
    stems it measured faster on (:data:`conv_nhwc._FEWC_MAX_TAPS`, ``_FEWC_MAX_M``): the
    kernel's tests lift that rule, the dispatch test keeps it."""
    if request.node.originalname != "test_the_dispatch_sends_it_the_stems_it_is_faster_on":
        monkeypatch.setattr(conv_nhwc, "_FEWC_MAX_TAPS", 1 << 30)
        monkeypatch.setattr(conv_nhwc, "_FEWC_MAX_M", 1 << 30)


def _conv(x, w, b=None, z=None, act="", params=(), stride=(1, 1), pads=(0, 0, 0, 0),
          dilations=(1, 1)):
    return lookup("NhwcConv", FUSED_DOMAIN, 1).fn(
        x, w, b, z, activation=act, activation_params=list(params), pads=list(pads),
        strides=list(stride), dilations=list(dilations))


def _calls(monkeypatch):
    calls = []
    real = conv_nhwc.call_blocks
    monkeypatch.setattr(conv_nhwc, "call_blocks",
                        lambda k, blocks, work: calls.append((k.name, len(blocks)))
                        or real(k, blocks, work))
    return calls


# (C, H, W, kh, kw, strides, pads, M): every tail of the 8-channel vectors and the 32-channel
# blocks (M 1, 7, 8, 20, 24, 29, 32, 40, 64; C 1 to 4), stems' shapes, kernels wider than the input,
# windows in the padding only (pads 3 with a 3x3 kernel)
CASES = [(3, 16, 17, 3, 3, (2, 2), (1, 1, 1, 1), 24),
         (3, 16, 17, 3, 3, (2, 2), (1, 1, 1, 1), 32),
         (3, 9, 10, 7, 7, (2, 2), (3, 3, 3, 3), 64),
         (1, 7, 5, 3, 3, (1, 1), (1, 1, 1, 1), 7),   # C = M = 1 would be depthwise
         (4, 6, 7, 5, 5, (1, 2), (2, 0, 1, 3), 29),
         (3, 5, 5, 1, 3, (3, 1), (0, 1, 0, 1), 1),
         (3, 2, 3, 3, 3, (1, 1), (3, 3, 3, 3), 20),
         (3, 8, 8, 3, 3, (2, 2), (0, 0, 0, 0), 40),
         (4, 3, 11, 2, 2, (1, 1), (0, 0, 0, 0), 8)]


@pytest.mark.parametrize("case", CASES)
def test_against_numpy_and_split_over_the_pool(fewc, monkeypatch, case):
    C, H, W, kh, kw, stride, pads, M = case
    oh = (H + pads[0] + pads[2] - kh) // stride[0] + 1
    ow = (W + pads[1] + pads[3] - kw) // stride[1] + 1
    xn = RNG.standard_normal((2, C, H, W)).astype(np.float32)
    w = RNG.standard_normal((kh, kw, C, M)).astype(np.float32)
    b = RNG.standard_normal(M).astype(np.float32)
    z = RNG.standard_normal((2, oh, ow, M)).astype(np.float32)
    calls = _calls(monkeypatch)
    for x in (xn.transpose(0, 2, 3, 1), np.ascontiguousarray(xn.transpose(0, 2, 3, 1)),
              xn.transpose(0, 2, 3, 1)[:, ::-1, ::-1]):   # the NHWC view, a copy, reversed
        for zz, act, params in ((None, "", ()), (z, "Clip", (0.0, 6.0)), (z, "Relu", ())):
            got = _conv(x, w, b, zz, act, params, stride, pads)
            with compiled.disabled():
                ref = _conv(x, w, b, zz, act, params, stride, pads)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert len(calls) == 9 and {c[0] for c in calls} == {"dwconv_avx2.fewc"}
    monkeypatch.setattr(conv_nhwc, "n_workers", lambda: 2)
    monkeypatch.setattr(conv_nhwc, "_split_min", lambda: 0)
    x = xn.transpose(0, 2, 3, 1)
    split = _conv(x, w, b, z, "Clip", (0.0, 6.0), stride, pads)
    assert calls[-1][1] > 1
    monkeypatch.setattr(conv_nhwc, "_split_min", lambda: 1 << 62)
    one = _conv(x, w, b, z, "Clip", (0.0, 6.0), stride, pads)
    assert calls[-1][1] == 1
    np.testing.assert_array_equal(split.view(np.int32), one.view(np.int32))


def test_nan_inf_as_numpy(fewc):
    xn = RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)
    xn[0, 1, 0, 0] = np.nan   # a corner: seen by border windows only
    xn[0, 2, 4, 4] = np.inf   # interior
    w = RNG.standard_normal((3, 3, 3, 17)).astype(np.float32)
    w[0, 0, 0, 5] = np.inf    # reads the padding for the top-left windows: 0 * Inf = NaN
    x = xn.transpose(0, 2, 3, 1)
    got = _conv(x, w, None, None, "Clip", (-1.0, 1.0), (2, 2), (1, 1, 1, 1))
    with compiled.disabled(), np.errstate(invalid="ignore"):
        ref = _conv(x, w, None, None, "Clip", (-1.0, 1.0), (2, 2), (1, 1, 1, 1))
    assert np.isnan(ref).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_where_it_is_not_used(fewc, monkeypatch):
    """More than 4 channels, a dilation, an activation that is no clip, float64, an empty
    batch, kernels off: other paths (their own answers, checked elsewhere)."""
    calls = _calls(monkeypatch)
    x = RNG.standard_normal((1, 6, 6, 5)).astype(np.float32)
    _conv(x, RNG.standard_normal((3, 3, 5, 8)).astype(np.float32), pads=(1, 1, 1, 1))
    x = x[..., :3]
    w = RNG.standard_normal((3, 3, 3, 8)).astype(np.float32)
    _conv(x, w, dilations=(2, 2))
    _conv(x, w, act="LeakyRelu", params=(0.1,))
    _conv(x.astype(np.float64), w.astype(np.float64))
    assert _conv(x[:0], w).shape == (0, 4, 4, 8)
    with compiled.disabled():
        _conv(x, w)
    assert not any(c[0] == "dwconv_avx2.fewc" for c in calls)
    _conv(x, w)
    assert calls[-1][0] == "dwconv_avx2.fewc"


def test_the_dispatch_sends_it_the_stems_it_is_faster_on(fewc, monkeypatch):
    """MobileNetV2/ShuffleNetV2's 3x3 stems to 24/32 channels go to it; ResNet's 7x7 stem to
    64 channels and a 3x3 stem to 64 go to ``gemm_avx2.iconv`` (measured faster there)."""
    calls = _calls(monkeypatch)
    x = RNG.standard_normal((1, 3, 9, 9)).astype(np.float32).transpose(0, 2, 3, 1)
    for (k, m), want in (((3, 32), True), ((3, 24), True), ((7, 64), False),
                         ((3, 64), False), ((5, 16), False)):
        w = RNG.standard_normal((k, k, 3, m)).astype(np.float32)
        n0 = len(calls)
        y = _conv(x, w, stride=(2, 2), pads=(k // 2,) * 4)
        assert any(c[0] == "dwconv_avx2.fewc" for c in calls[n0:]) is want, (k, m)
        with compiled.disabled():
            ref = _conv(x, w, stride=(2, 2), pads=(k // 2,) * 4)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
