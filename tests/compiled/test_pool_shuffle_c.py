"""The C NHWC max pool ``dwconv_avx2.maxpool`` against the numpy path (the reference): every
channel tail (vector blocks of 32 and 8, scalar remainder), kernel sizes, strides, dilations,
pads on every side, ceil_mode, windows with no tap inside, NaN/Inf, an empty batch, and the
split over row blocks. The two-way channel interleave ``dwconv_avx2.interleave2``
(NhwcConcatShuffle with 2 groups) against the numpy path: channel tails, channel-slice views,
bit patterns, inputs it does not take."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.ops import nhwc, pool
from workbench.ops.registry import FUSED_DOMAIN, lookup

RNG = np.random.default_rng(2314)


@pytest.fixture(scope="module")
def mp():
    why = compiled.c_unavailable("dwconv_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["dwconv_avx2"], timeout=300):
        pytest.skip(f"dwconv_avx2 is not available: {compiled.status()['modules']}")
    return compiled.kernel("dwconv_avx2.maxpool")


def _pool(x, **attrs):
    return lookup("NhwcMaxPool", FUSED_DOMAIN, 1).fn(x, **attrs)


def _both(x, calls, **attrs):
    with compiled.disabled():
        want = _pool(x, **attrs)
    n = len(calls)
    got = _pool(x, **attrs)
    assert len(calls) == n + 1, "the C path was not taken"
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)   # NaN == NaN here
    return got


@pytest.fixture
def calls(mp, monkeypatch):
    seen = []
    real = pool._nhwc_max_pool_c
    monkeypatch.setattr(pool, "_nhwc_max_pool_c", lambda *a: seen.append(1) or real(*a))
    return seen


CASES = [   # (kernel, strides, dilations, pads t l b r, ceil_mode)
    ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1], 0),
    ([3, 3], [2, 2], [1, 1], [0, 0, 0, 0], 1),
    ([2, 2], [2, 2], [1, 1], [0, 0, 0, 0], 0),
    ([3, 2], [1, 2], [1, 1], [1, 0, 2, 1], 0),
    ([3, 3], [2, 1], [2, 2], [2, 1, 0, 2], 1),
    ([5, 4], [3, 3], [1, 2], [2, 3, 1, 0], 1),
    ([1, 1], [2, 2], [1, 1], [0, 0, 0, 0], 0),
]


@pytest.mark.parametrize("c", [1, 5, 8, 13, 32, 45])
def test_every_channel_tail_window_and_padding(calls, c):
    for n, h, w in ((1, 7, 9), (2, 5, 4)):
        x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
        for ks, st, dl, pads, ceil in CASES:
            _both(x, calls, kernel_shape=ks, strides=st, dilations=dl, pads=pads,
                  ceil_mode=ceil)
        _both(x, calls, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")


def test_nan_and_inf_like_numpy(calls):
    """A NaN tap makes its windows NaN whatever its place among the taps (first, middle,
    last, tail channel); -inf/+inf are ordinary values; windows without NaN are untouched."""
    x = RNG.standard_normal((2, 9, 8, 19)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan     # first tap of a window
    x[0, 4, 5, 3] = np.nan     # a middle one
    x[1, 8, 7, 17] = np.nan    # the last tap, a scalar tail channel
    x[1, 2, 2, 9] = np.inf
    x[0, 6, 1, 12] = -np.inf
    x[1, 5, :, 5] = -np.inf
    for ks, st, dl, pads, ceil in CASES:
        got = _both(x, calls, kernel_shape=ks, strides=st, dilations=dl, pads=pads,
                    ceil_mode=ceil)
    assert np.isnan(got).any() and np.isinf(got).any()


def test_empty_batch_and_other_dtypes_stay_on_numpy(calls):
    x = np.zeros((0, 6, 6, 10), np.float32)
    assert _pool(x, kernel_shape=[3, 3], strides=[2, 2]).shape == (0, 2, 2, 10)
    n = len(calls)
    for dt in (np.float64, np.uint8):
        xd = (RNG.random((1, 6, 6, 10)) * 100).astype(dt)
        y = _pool(xd, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        assert y.dtype == dt and y.shape == (1, 3, 3, 10)
    assert len(calls) == n


def test_row_blocks_cover_the_output_exactly(calls, monkeypatch):
    """With the split threshold at 0 the call is cut into blocks of a few rows (across
    images); the result is the single call's."""
    x = RNG.standard_normal((3, 11, 10, 24)).astype(np.float32)
    monkeypatch.setattr(pool, "_C_SPLIT_MIN", 0)
    monkeypatch.setattr(pool, "_C_BLOCK", 5 * 24 * 2)
    _both(x, calls, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    _both(x, calls, kernel_shape=[2, 3], strides=[1, 1], pads=[0, 1, 1, 0], ceil_mode=1)


def _shuffle(*xs):
    return lookup("NhwcConcatShuffle", FUSED_DOMAIN, 1).fn(*xs, groups=2)


@pytest.mark.parametrize("c", [1, 7, 8, 13, 58])
def test_interleave_matches_numpy_on_arrays_and_channel_slices(mp, monkeypatch, c):
    seen = []
    real = nhwc._interleave_c
    monkeypatch.setattr(nhwc, "_interleave_c", lambda *a: seen.append(real(*a)) or seen[-1])
    wide = RNG.standard_normal((2, 3, 5, 2 * c + 3)).astype(np.float32)
    b = RNG.standard_normal((2, 3, 5, c)).astype(np.float32)
    pairs = ((wide[..., :c], b), (b, wide[..., c + 3:]),
             (wide[:1, 2:, 4:, 1:c + 1], b[:1, :1, :1]))
    for pair in pairs:
        with compiled.disabled():
            want = _shuffle(*pair)
        got = _shuffle(*pair)
        assert seen[-1] is True
        np.testing.assert_array_equal(got, want)


def test_interleave_copies_bits_and_leaves_other_inputs_to_numpy(mp):
    a = RNG.integers(-2**31, 2**31 - 1, (1, 4, 3, 11), dtype=np.int64).astype(np.int32)
    b = RNG.integers(-2**31, 2**31 - 1, (1, 4, 3, 11), dtype=np.int64).astype(np.int32)
    a[0, 1, 1, :] = np.float32(np.nan).view(np.int32) | 1   # NaN payloads as float32
    with compiled.disabled():
        want = _shuffle(a, b)
    y = np.empty_like(want)
    assert nhwc._interleave_c(y, a, b)
    np.testing.assert_array_equal(y, want)
    fa, fb = a.view(np.float32), b.view(np.float32)
    assert nhwc._interleave_c(np.empty(want.shape, np.float32), fa, fb)
    y = np.empty(want.shape, np.float32)
    nhwc._interleave_c(y, fa, fb)
    np.testing.assert_array_equal(y.view(np.int32), want)
    # pixels not evenly spaced, other item sizes, unequal halves: the numpy path
    x = RNG.standard_normal((1, 8, 3, 6)).astype(np.float32)
    assert not nhwc._interleave_c(np.empty((1, 4, 3, 12), np.float32), x[:, ::2], x[:, 1::2])
    assert not nhwc._interleave_c(np.empty((1, 8, 3, 12)), x.astype(np.float64),
                                  x.astype(np.float64))
    assert not nhwc._interleave_c(np.empty((1, 8, 3, 10), np.float32), x, x[..., :4])
    with compiled.disabled():
        want = _shuffle(x[:, ::2], x[:, 1::2])
    np.testing.assert_array_equal(_shuffle(x[:, ::2], x[:, 1::2]), want)


def test_interleave_split_over_pixel_blocks(mp, monkeypatch):
    monkeypatch.setattr(nhwc, "_INTERLEAVE_SPLIT", 0)
    a = RNG.standard_normal((3, 5, 7, 9)).astype(np.float32)
    b = RNG.standard_normal((3, 5, 7, 9)).astype(np.float32)
    with compiled.disabled():
        want = _shuffle(a, b)
    np.testing.assert_array_equal(_shuffle(a, b), want)


def test_few_channel_views_are_made_contiguous_plane_by_plane():
    """NhwcConv's input made contiguous: the network input's NCHW -> NHWC view (few
    channels, copied a plane at a time) and other views give their contiguous copy, and the
    stem convolution gives the same result on the view as on the copy."""
    from workbench.ops import conv_nhwc

    x0 = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)
    for v in (x0.transpose(0, 2, 3, 1), x0.transpose(0, 2, 3, 1)[:, ::2, 1:],
              RNG.standard_normal((1, 4, 5, 20)).astype(np.float32)[..., ::2]):
        got = conv_nhwc._contiguous(v)
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, v)
    w = RNG.standard_normal((3, 3, 3, 10)).astype(np.float32)
    conv = lookup("NhwcConv", FUSED_DOMAIN, 1).fn
    kw = dict(activation="Relu", activation_params=[], group=1, pads=[1, 1, 1, 1],
              strides=[2, 2], kernel_shape=[3, 3])
    v = x0.transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(conv(v, w, None, None, **kw),
                                  conv(np.ascontiguousarray(v), w, None, None, **kw))
