"""The CPU fast paths of the gradient rules against their plain paths (issue 16).

Conv (batched-GEMM weight and input gradients, col2im clipped into the unpadded input), MaxPool
(first maximum found tap by tap), training BatchNormalization (cache-blocked forward and
backward), MatMul/Gemm (products split over worker threads with single-threaded BLAS): each
fast path gives what its plain path gives (the plain paths are checked against finite
differences in ``test_grad_rules.py`` and whole models against PyTorch in ``test_vs_torch.py``),
in float64 and float32, with one worker thread and with several (``WORKBENCH_NUM_THREADS``),
and with blocks small enough that the work is really split.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench import autograd
from workbench.autodiff.rules import conv as gconv
from workbench.autodiff.rules import norm as gnorm
from workbench.autodiff.rules import pool as gpool
from workbench.autodiff.rules.linalg import matmul_grads
from workbench.ops.registry import lookup
from workbench.tensor import Tensor

THREADS = ["1", "2"]


@pytest.fixture(params=THREADS, ids=[f"threads{t}" for t in THREADS])
def threads(request, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NUM_THREADS", request.param)
    return int(request.param)


def _close(got, want, dtype):
    tol = 1e-11 if dtype == np.float64 else 2e-5
    scale = max(1.0, float(np.abs(want).max()))
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


# --------------------------------------------------------------------------- Conv
CONV_CASES = [  # x shape, out channels, kernel, strides, dilations, pads begin, pads end
    ((2, 3, 9, 8), 4, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    ((2, 5, 11, 10), 6, (3, 3), (2, 2), (1, 1), (1, 0), (0, 1)),
    ((1, 4, 12, 12), 3, (3, 2), (2, 1), (2, 1), (0, 2), (1, 0)),
    ((3, 2, 7, 7), 5, (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    ((2, 3, 15, 15), 8, (7, 7), (2, 2), (1, 1), (3, 3), (3, 3)),     # a ResNet stem
    ((2, 6, 5, 5), 4, (3, 3), (3, 3), (1, 1), (0, 0), (0, 0)),       # stride > kernel: gaps
    ((2, 4, 6, 6), 7, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),       # 1x1, per-image products
    ((2, 40, 3, 3), 50, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),     # 1x1, merged (small P)
    ((2, 4, 7, 7), 6, (1, 1), (2, 2), (1, 1), (0, 0), (0, 0)),       # 1x1 stride 2
    ((2, 3, 4, 4), 2, (1, 1), (1, 1), (1, 1), (1, 1), (1, 1)),       # 1x1 with pads
    ((2, 3, 10), 4, (3,), (2,), (1,), (1,), (1,)),                   # 1-D
    ((1, 2, 5, 6, 7), 3, (3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),  # 3-D
    ((8, 16, 14, 14), 24, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),   # several blocks
    ((2, 3, 9, 10), 4, (3, 3), (1, 1), (2, 1), (2, 0), (1, 2)),      # stride 1, dilated
    ((2, 3, 8, 8), 4, (3, 3), (1, 1), (1, 1), (3, 1), (0, 2)),       # pads beyond the kernel
]


def _conv_case(case, dtype, seed=0):
    xs, m, k, s, d, pb, pe = case
    r = np.random.default_rng(seed)
    x = r.standard_normal(xs).astype(dtype)
    w = r.standard_normal((m, xs[1]) + k).astype(dtype)
    y = lookup("Conv", "", 11).fn(x, w, None, strides=list(s), dilations=list(d),
                                  pads=list(pb) + list(pe))
    gy = r.standard_normal(y.shape).astype(dtype)
    return x, w, gy, list(k), list(s), list(d), list(pb), list(pe)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv_fast_path_equals_plain(case, dtype, threads, monkeypatch):
    monkeypatch.setattr(gconv, "_DCOLS_BLOCK", 64)  # many input-gradient column blocks
    x, w, gy, k, s, d, pb, pe = _conv_case(case, dtype)
    assert gconv._fast_cpu(np, 1, x, w, gy)
    want_x = gconv._input_grad_plain(np, gy, w, x.shape, 1, k, s, d, pb, pe)
    want_w = gconv._weight_grad_plain(np, x, gy, w.shape, 1, k, s, d, pb, pe)
    got_x, got_w = gconv._grads_cpu(x, gy, w, w.shape, x.shape, k, s, d, pb, pe, True, True)
    _close(got_x, np.ascontiguousarray(want_x), dtype)
    _close(got_w, want_w, dtype)
    only_x = gconv._grads_cpu(x, gy, w, w.shape, x.shape, k, s, d, pb, pe, True, False)
    only_w = gconv._grads_cpu(x, gy, w, w.shape, x.shape, k, s, d, pb, pe, False, True)
    assert only_x[1] is None and only_w[0] is None
    _close(only_x[0], got_x, dtype)
    _close(only_w[1], got_w, dtype)


def test_conv_rule_takes_the_fast_path_only_where_it_applies():
    x, w, gy, *_ = _conv_case(CONV_CASES[0], np.float32)
    assert gconv._fast_cpu(np, 1, x, w, gy)
    assert not gconv._fast_cpu(np, 2, x, w, gy)                       # grouped
    assert not gconv._fast_cpu(np, 1, x.astype(np.float16), w, gy)    # half: plain path
    assert not gconv._fast_cpu(np, 1, x, w.astype(np.float64), gy)   # mixed dtypes


def test_conv_rule_through_the_tape_matches_plain():
    """The registered rule (fast path) inside a real backward, against the plain helpers."""
    x, w, gy, k, s, d, pb, pe = _conv_case(CONV_CASES[1], np.float64, seed=3)
    tx, tw = Tensor(data=x, requires_grad=True), Tensor(data=w, requires_grad=True)
    y = autograd.apply("Conv", [tx, tw], {"strides": s, "pads": pb + pe, "dilations": d})
    grads = dict((id(t), g.numpy()) for t, g in autograd.backward(y, gy))
    _close(grads[id(tx)], np.ascontiguousarray(
        gconv._input_grad_plain(np, gy, w, x.shape, 1, k, s, d, pb, pe)), np.float64)
    _close(grads[id(tw)], gconv._weight_grad_plain(np, x, gy, w.shape, 1, k, s, d, pb, pe),
           np.float64)


# --------------------------------------------------------------------------- MaxPool
POOL_CASES = [  # x shape, kernel, strides, dilations, pads, ceil_mode
    ((2, 3, 12, 12), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 0),      # ResNet's stem pool
    ((2, 3, 9, 8), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 0),
    ((1, 2, 10, 11), (3, 2), (2, 1), (2, 1), (1, 0, 0, 1), 0),
    ((2, 2, 7, 7), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 1),        # ceil mode
    ((2, 3, 10), (3,), (2,), (1,), (1, 1), 0),                      # 1-D
    ((1, 2, 5, 6, 7), (2, 3, 2), (1, 2, 2), (1, 1, 1), (0, 1, 0, 0, 1, 1), 0),  # 3-D
    ((8, 16, 20, 20), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0),     # several blocks
]


def _maxpool(x, k, s, d, pads, ceil):
    y = lookup("MaxPool", "", 12).fn(x, kernel_shape=list(k), strides=list(s),
                                     dilations=list(d), pads=list(pads), ceil_mode=ceil)
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_maxpool_fast_path_equals_plain(case, ties, dtype, threads, monkeypatch):
    monkeypatch.setattr(gpool, "_POOL_BLOCK", 300)  # several channel blocks per image
    xs, k, s, d, pads, ceil = case
    r = np.random.default_rng(1)
    # ties: few distinct values, so that windows hold several maxima (the first one wins)
    x = (r.integers(0, 3, xs) if ties else r.standard_normal(xs)).astype(dtype)
    y = _maxpool(x, k, s, d, pads, ceil)
    g = r.standard_normal(y.shape).astype(dtype)
    nsp = len(k)
    pb, pe = list(pads[:nsp]), list(pads[nsp:])
    want = gpool._max_pool_grad_plain(np, x, g, list(k), list(s), list(d), pb, pe)
    got = gpool._max_pool_grad_cpu(x, y, g, list(k), list(s), list(d), pb)
    assert got is not None
    _close(got, np.ascontiguousarray(want), dtype)


def test_maxpool_nan_windows_take_the_plain_path():
    r = np.random.default_rng(2)
    x = r.standard_normal((2, 2, 6, 6))
    x[1, 0, 2, 3] = np.nan
    y = _maxpool(x, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 0)
    g = r.standard_normal(y.shape)
    assert gpool._max_pool_grad_cpu(x, y, g, [2, 2], [2, 2], [1, 1], [0, 0]) is None
    tx = Tensor(data=x, requires_grad=True)
    ty = autograd.apply("MaxPool", [tx], {"kernel_shape": [2, 2], "strides": [2, 2]})
    (_, gx), = autograd.backward(ty, g)
    want = gpool._max_pool_grad_plain(np, x, g, [2, 2], [2, 2], [1, 1], [0, 0], [0, 0])
    np.testing.assert_array_equal(gx.numpy(), want)


# --------------------------------------------------------------------------- BatchNorm
BN_SHAPES = [(4, 6, 9, 11), (3, 5, 40), (2, 3, 4, 5, 6), (8, 16, 28, 28)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=[str(s) for s in BN_SHAPES])
def test_batchnorm_training_fast_path_equals_plain(shape, dtype, threads, monkeypatch):
    monkeypatch.setattr(gnorm, "_BN_BLOCK", 50)   # many blocks, channels split
    monkeypatch.setattr(gnorm, "_BN_MIN", 0)
    r = np.random.default_rng(4)
    c = shape[1]
    # an offset mean and a spread of scales per channel (cancellation in E[x^2] - E[x]^2)
    x = (r.standard_normal(shape) * r.uniform(0.1, 3, (1, c) + (1,) * (len(shape) - 2))
         + r.uniform(-20, 20, (1, c) + (1,) * (len(shape) - 2))).astype(dtype)
    g = r.standard_normal(shape).astype(dtype)
    sc, b = (r.random(c) + 0.5).astype(dtype), r.standard_normal(c).astype(dtype)
    rm, rv = r.standard_normal(c).astype(dtype), (r.random(c) + 0.5).astype(dtype)
    assert gnorm._bn_fast(x, sc, 1)
    want = gnorm._bn_train_plain(x, sc, b, rm, rv, 1e-5, 0.9, 1)
    got = gnorm.batchnorm_train(x, sc, b, rm, rv, epsilon=1e-5, momentum=0.9)
    for gv, wv in zip(got, want):
        _close(np.asarray(gv).reshape(np.shape(wv)), np.asarray(wv), dtype)
    bs = (1, c) + (1,) * (len(shape) - 2)
    need = (True, True, True)
    want_g = gnorm._bn_train_grad_cpu(x, g, want[3].reshape(bs), want[4].reshape(bs),
                                      sc.reshape(bs), sc, b, need)
    got_g = gnorm._bn_train_grad_blocked(x, g, got[3], got[4], sc, b, need)
    for gv, wv in zip(got_g[:3], want_g[:3]):
        _close(gv, wv, dtype)
    part = gnorm._bn_train_grad_blocked(x, g, got[3], got[4], sc, b, (False, True, False))
    assert part[0] is None and part[2] is None
    _close(part[1], got_g[1], dtype)


def test_batchnorm_fast_path_only_where_it_applies():
    x = np.zeros((8, 16, 64, 64), np.float32)
    sc = np.ones(16, np.float32)
    assert gnorm._bn_fast(x, sc, 1)
    assert not gnorm._bn_fast(x.astype(np.float16), sc, 1)           # half: plain path
    assert not gnorm._bn_fast(x[:, :, ::2], sc, 1)                    # not contiguous
    assert not gnorm._bn_fast(np.zeros((8, 16), np.float32), sc, 1)  # no spatial axes
    assert not gnorm._bn_fast(np.zeros((2, 3, 4, 4), np.float32), np.ones(3), 1)  # small


# --------------------------------------------------------------------------- MatMul / Gemm
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matmul_gradients_split_over_threads_equal_plain_products(dtype, threads):
    r = np.random.default_rng(5)
    a = r.standard_normal((4, 96, 200)).astype(dtype)    # large enough to be split
    b = r.standard_normal((200, 300)).astype(dtype)
    g = r.standard_normal((4, 96, 300)).astype(dtype)
    ga, gb = matmul_grads(np, g, a, b)
    _close(ga, g @ b.T, dtype)
    _close(gb, np.einsum("nik,nij->kj", a, g), dtype)
    a4 = r.standard_normal((2, 3, 64, 80)).astype(dtype)  # batched (attention-like)
    b4 = r.standard_normal((2, 3, 80, 70)).astype(dtype)
    g4 = r.standard_normal((2, 3, 64, 70)).astype(dtype)
    ga4, gb4 = matmul_grads(np, g4, a4, b4)
    _close(ga4, g4 @ b4.swapaxes(-1, -2), dtype)
    _close(gb4, a4.swapaxes(-1, -2) @ g4, dtype)


@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_gradients_in_the_inputs_layout(trans):
    ta, tb = trans
    r = np.random.default_rng(6)
    a = r.standard_normal((5, 3) if ta else (3, 5))
    b = r.standard_normal((4, 5) if tb else (5, 4))
    g = r.standard_normal((3, 4))
    t_a, t_b = Tensor(data=a, requires_grad=True), Tensor(data=b, requires_grad=True)
    y = autograd.apply("Gemm", [t_a, t_b], {"transA": ta, "transB": tb, "alpha": 0.5})
    got = {id(t): gr.numpy() for t, gr in autograd.backward(y, g)}
    ap, bp = (a.T if ta else a), (b.T if tb else b)
    want_a, want_b = 0.5 * g @ bp.T, 0.5 * ap.T @ g
    np.testing.assert_allclose(got[id(t_a)], want_a.T if ta else want_a, rtol=1e-12)
    np.testing.assert_allclose(got[id(t_b)], want_b.T if tb else want_b, rtol=1e-12)


@pytest.mark.parametrize("vocab,rows", [(1000, 256), (2, 256), (5, 2000), (200, 300), (40, 300),
                                        (9, 7)])
def test_gather_gradient_scatter_equals_add_at_bit_for_bit(vocab, rows):
    """Gather's gradient scatter (distinct indices at once, repeats in passes, few distinct
    indices by running sums, small ones by add.at) gives ``np.add.at``'s bits, -0.0 and
    float64 included: an embedding's gradient as before."""
    from workbench.autodiff.rules.shape import _scatter_rows
    rng = np.random.default_rng(vocab)
    for dtype in (np.float32, np.float64):
        idx = rng.integers(0, vocab, rows)
        if vocab == 2:
            idx[:] = 1                    # one segment id for every token
        g = rng.standard_normal((rows, 64)).astype(dtype)
        g[rng.random(g.shape) < 0.2] = -0.0
        ref = np.zeros((vocab, 64), dtype)
        np.add.at(ref, idx, g)
        got = _scatter_rows(np.zeros((vocab, 64), dtype), idx, g)
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
    x = Tensor(data=rng.standard_normal((vocab, 64)).astype(np.float32), requires_grad=True)
    y = autograd.apply("Gather", [x, idx.reshape(-1, 1)], {"axis": 0})
    autograd.backward(autograd.apply("ReduceSum", [y], {"keepdims": 0}))
    ref = np.zeros((vocab, 64), np.float32)
    np.add.at(ref, idx, np.ones((rows, 64), np.float32))
    np.testing.assert_array_equal(x.grad.data, ref)


def test_erf_gradient_in_place_equals_the_formula_bit_for_bit():
    """Erf's gradient with its temporaries reused: ``g * (2 / sqrt(pi)) * exp(-x * x)``'s
    bits (the same operations in the same order)."""
    import math

    from workbench.autodiff.rules.elementwise import erf_grad
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        x, g = rng.standard_normal((2, 3, 40)).astype(dtype), rng.standard_normal(
            (2, 3, 40)).astype(dtype)
        x[0, 0, :3] = [np.inf, -0.0, 30.0]
        ref = g * (2.0 / math.sqrt(math.pi)) * np.exp(-x * x)
        got = erf_grad(type("Ctx", (), {"xp": np}), [g], [x], [None])[0]
        assert got.dtype == ref.dtype
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
