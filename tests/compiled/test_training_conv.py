"""The training step's compiled paths against the numpy paths: Conv's training form and the
stride-1 input gradient on ``gemm_avx2.iconv`` (``autodiff/rules/conv.py``), MaxPool's
gradient on ``conv_grad.maxpool_dx`` (``autodiff/rules/pool.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.autodiff.rules import conv as rc
from workbench.autodiff.rules import pool as rp
from workbench.ops.registry import lookup, train_form

RNG = np.random.default_rng(2324)


@pytest.fixture
def iconv(monkeypatch):
    why = compiled.c_unavailable("gemm_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["gemm_avx2"], timeout=300):
        pytest.skip(f"gemm_avx2 is not available: {compiled.status()['modules']}")
    # small shapes here: take iconv whatever the size (the thresholds are for speed)
    monkeypatch.setattr(rc, "_ICONV_MIN_ROWS", 0)
    monkeypatch.setattr(rc, "_ICONV_MIN_C", 1)
    return compiled.kernel("gemm_avx2.iconv")


@pytest.fixture(scope="module")
def maxpool_kernel():
    if not compiled.wait(["conv_grad"], timeout=900):
        pytest.skip(f"compiled kernels unavailable: {compiled.status()['modules']}")
    return compiled.kernel("conv_grad.maxpool_dx")


def _conv(x, w, b=None, **attrs):
    return lookup("Conv", "", 11).fn(x, w, b, **attrs)


def _close(got, want, k):
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, k ** 0.5))


# (N, C, H, W, M, kernel, strides, pads, dilations): every row tail (pixels not a multiple
# of the 6-pixel tile), columns ending a 16-column panel anywhere, few and many channels
CASES = [
    (2, 5, 7, 9, 17, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 16, 6, 6, 40, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    (3, 9, 8, 5, 7, (3, 2), (1, 2), (2, 0, 0, 1), (1, 1)),     # asymmetric pads
    (1, 4, 9, 9, 33, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),    # dilation
    (2, 3, 11, 11, 8, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),   # a 3-channel stem
]


@pytest.mark.parametrize("n,c,h,w,m,k,s,p,d", CASES)
def test_training_conv_matches_the_numpy_conv(iconv, n, c, h, w, m, k, s, p, d):
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((m, c) + k).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    attrs = dict(strides=list(s), pads=list(p), dilations=list(d))
    with compiled.disabled():
        want = _conv(x, wt, b, **attrs)
        assert np.array_equal(rc.conv_train(x, wt, b, **attrs), want)   # the fallback
    _close(rc.conv_train(x, wt, b, **attrs), want, c * k[0] * k[1])
    _close(rc.conv_train(x, wt, None, **attrs), _conv(x, wt, None, **attrs), c * k[0] * k[1])


@pytest.mark.parametrize("n,c,h,w,m,k,s,p,d", [c_ for c_ in CASES if c_[6] == (1, 1)])
def test_stride1_input_gradient_matches_the_plain_rule(iconv, n, c, h, w, m, k, s, p, d):
    x_shape = (n, c, h, w)
    wt = RNG.standard_normal((m, c) + k).astype(np.float32)
    oh = (h + p[0] + p[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (w + p[1] + p[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    gy = RNG.standard_normal((n, m, oh, ow)).astype(np.float32)
    args = (list(k), list(s), list(d), list(p[:2]), list(p[2:]))
    want = rc._input_grad_plain(np, gy, wt, x_shape, 1, *args)
    got = rc._grads_cpu(None, gy, wt, wt.shape, x_shape, *args, True, False)[0]
    assert rc._input_grad_iconv(gy, wt, x_shape, list(d),
                                [(k[i] - 1) * d[i] - p[i] for i in range(2)]
                                + [(k[i] - 1) * d[i] - p[2 + i] for i in range(2)]) is not None
    _close(got, want, m * k[0] * k[1])


def test_nan_empty_batch_threads_and_the_training_form(iconv, monkeypatch):
    assert train_form("Conv", "", 11).fn is rc.conv_train
    x = RNG.standard_normal((2, 6, 8, 8)).astype(np.float32)
    wt = RNG.standard_normal((10, 6, 3, 3)).astype(np.float32)
    x[1, 2, 3, 4] = np.nan
    x[0, 0, 0, 0] = np.inf
    attrs = dict(pads=[1, 1, 1, 1])
    got = rc.conv_train(x, wt, None, **attrs)
    want = _conv(x, wt, None, **attrs)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-4)
    # results do not depend on the engine's thread count (the pool splits output pixels)
    x = RNG.standard_normal((3, 6, 13, 11)).astype(np.float32)
    one = rc.conv_train(x, wt, None, **attrs)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    assert np.array_equal(rc.conv_train(x, wt, None, **attrs), one)
    empty = rc.conv_train(np.zeros((0, 6, 8, 8), np.float32), wt, None, **attrs)
    assert empty.shape == (0, 10, 8, 8) and empty.dtype == np.float32


def _pool(x, k, s, p, d):
    y = lookup("MaxPool", "", 12).fn(x, kernel_shape=list(k), strides=list(s), pads=list(p),
                                     dilations=list(d))
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("k,s,p,d", [
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),     # ResNet's stem pool
    ((2, 3), (1, 2), (0, 1, 1, 0), (1, 1)),     # asymmetric pads, overlapping rows
    ((3, 2), (2, 1), (1, 0, 1, 1), (2, 1)),     # dilation
])
def test_maxpool_gradient_matches_numpy_bit_for_bit(maxpool_kernel, k, s, p, d):
    # small integers: many ties inside a window (the first maximum takes the gradient) and
    # inputs shared by several windows (their gradients summed in tap order)
    x = RNG.integers(-3, 3, (2, 3, 9, 10)).astype(np.float32)
    y = _pool(x, k, s, p, d)
    g = RNG.standard_normal(y.shape).astype(np.float32)
    pb = list(p[:2])
    got = rp._max_pool_grad_compiled(x, y, g, list(k), list(s), list(d), pb)
    assert got is not None
    assert np.array_equal(got, rp._max_pool_grad_cpu(x, y, g, list(k), list(s), list(d), pb))
    np.testing.assert_allclose(
        got, rp._max_pool_grad_plain(np, x, g, list(k), list(s), list(d), pb, list(p[2:])),
        rtol=1e-6, atol=1e-6)


def test_maxpool_gradient_nan_and_empty(maxpool_kernel):
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 1, 2, 2] = np.nan
    k, s, d, pb = [3, 3], [2, 2], [1, 1], [1, 1]
    y = _pool(x, k, s, [1, 1, 1, 1], d)
    g = np.ones(y.shape, np.float32)
    assert rp._max_pool_grad_compiled(x, y, g, k, s, d, pb) is None   # numpy runs instead
    assert rp._max_pool_grad_compiled(np.zeros((0, 2, 6, 6), np.float32),
                                      np.zeros((0, 2, 3, 3), np.float32),
                                      np.zeros((0, 2, 3, 3), np.float32), k, s, d, pb) is None
    # an Inf gradient stays in the windows it belongs to (as in the plain reference)
    x = RNG.standard_normal((1, 1, 6, 6)).astype(np.float32)
    y = _pool(x, k, s, [1, 1, 1, 1], d)
    g = np.zeros(y.shape, np.float32)
    g[0, 0, 0, 0] = np.inf
    got = rp._max_pool_grad_compiled(x, y, g, k, s, d, pb)
    assert np.isinf(got).sum() == 1 and not np.isnan(got).any()


@pytest.fixture
def wgrad(monkeypatch):
    why = compiled.c_unavailable("wgrad_avx2")
    if why:
        pytest.skip(why)
    if not compiled.wait(["wgrad_avx2"], timeout=300):
        pytest.skip(f"wgrad_avx2 is not available: {compiled.status()['modules']}")
    monkeypatch.setattr(rc, "_WGRAD_MIN_ROWS", 0)
    monkeypatch.setattr(rc, "_ICONV_MIN_C", 1)
    return compiled.kernel("wgrad_avx2.wgrad")


@pytest.mark.parametrize("n,c,h,w,m,k,s,p,d", CASES + [
    (2, 21, 5, 6, 13, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),   # every tile tail at once
])
def test_weight_gradient_matches_the_plain_rule(wgrad, monkeypatch, n, c, h, w, m, k, s, p,
                                                d):
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    oh = (h + p[0] + p[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (w + p[1] + p[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    gy = RNG.standard_normal((n, m, oh, ow)).astype(np.float32)
    w_shape = (m, c) + k
    args = (list(k), list(s), list(d), list(p[:2]), list(p[2:]))
    want = rc._weight_grad_plain(np, x, gy, w_shape, 1, *args)
    got = rc._weight_grad_c(x, gy, w_shape, *args[:4])
    assert got is not None
    _close(got, want, n * oh * ow)
    # the split over threads (output-channel or tap ranges) does not change a bit
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "3")
    assert np.array_equal(rc._weight_grad_c(x, gy, w_shape, *args[:4]), got)
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", "1")
    assert np.array_equal(rc._weight_grad_c(x, gy, w_shape, *args[:4]), got)


def test_weight_gradient_nan_padding_and_empty(wgrad):
    # an Inf output gradient next to the border meets the zero padding: 0 * Inf = NaN, as in
    # the im2col product of the numpy path
    x = RNG.standard_normal((1, 8, 5, 5)).astype(np.float32)
    gy = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    gy[0, 1, 0, 0] = np.inf
    x[0, 3, 2, 2] = np.nan
    args = ([3, 3], [1, 1], [1, 1], [1, 1])
    with np.errstate(invalid="ignore"):
        want = rc._weight_grad_plain(np, x, gy, (4, 8, 3, 3), 1, *args, [1, 1])
    got = rc._weight_grad_c(x, gy, (4, 8, 3, 3), *args)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-4)
    empty = rc._weight_grad_c(np.zeros((0, 8, 5, 5), np.float32),
                              np.zeros((0, 4, 5, 5), np.float32), (4, 8, 3, 3), *args)
    assert empty is not None and not empty.any() and empty.shape == (4, 8, 3, 3)


def test_both_gradients_share_one_channels_last_copy_of_dy(wgrad, iconv, monkeypatch):
    """With both gradients asked for, the input gradient reads the weight gradient's NHWC
    copy of dL/dy instead of making its own: the same bits as each gradient alone."""
    x = RNG.standard_normal((2, 7, 6, 5)).astype(np.float32)
    wt = RNG.standard_normal((9, 7, 3, 3)).astype(np.float32)
    gy = RNG.standard_normal((2, 9, 6, 5)).astype(np.float32)
    args = ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1])
    copies = []
    run = rc._iconv_nchw
    monkeypatch.setattr(rc, "_iconv_nchw", lambda *a: copies.append(a[-1]) or run(*a))
    gx, gw = rc._grads_cpu(x, gy, wt, wt.shape, x.shape, *args, True, True)
    assert len(copies) == 1 and copies[0] is not None   # the shared copy was handed over
    assert np.array_equal(gx, rc._grads_cpu(x, gy, wt, wt.shape, x.shape, *args, True,
                                            False)[0])
    assert np.array_equal(gw, rc._grads_cpu(x, gy, wt, wt.shape, x.shape, *args, False,
                                            True)[1])
    assert copies[1] is None   # the input gradient alone copies dL/dy itself


def test_compiled_paths_off_give_the_numpy_rule(wgrad, iconv):
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    wt = RNG.standard_normal((5, 8, 3, 3)).astype(np.float32)
    gy = RNG.standard_normal((2, 5, 6, 6)).astype(np.float32)
    args = ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1])
    with compiled.disabled():
        assert rc._weight_grad_c(x, gy, wt.shape, *args[:4]) is None
        assert rc._input_grad_iconv(gy, wt, x.shape, [1, 1], [1, 1, 1, 1]) is None
        ref = rc._grads_cpu(x, gy, wt, wt.shape, x.shape, *args, True, True)
    got = rc._grads_cpu(x, gy, wt, wt.shape, x.shape, *args, True, True)
    for r, g in zip(ref, got):
        _close(g, r, 2 * 6 * 6 * 9)


def test_conv_training_form_computes_the_same_function():
    """Conv's training form is only a faster way to the same convolution: training does not
    change what Conv computes (the trunk cache and others ask ``train_form_differs``), while
    BatchNormalization and Dropout do."""
    from workbench.autodiff import rules

    assert rules.train_form("Conv", "", 17) is not None
    assert not rules.train_form_differs("Conv", "", 17)
    assert rules.train_form_differs("BatchNormalization", "", 15)
    assert rules.train_form_differs("Dropout", "", 13)
    assert not rules.train_form_differs("Relu", "", 14)
