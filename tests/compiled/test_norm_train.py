"""Compiled training kernels of ``kernels/norm_train.py``: training-mode BatchNormalization
(the forward's batch statistics, normalised output and running-statistics update, and its
gradient rule) and LayerNormalization's gradient, against the numpy path
(``compiled.disabled()``, the reference) and against the float64 numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.autodiff.rules import GradContext
from workbench.autodiff.rules import norm as rn

RNG = np.random.default_rng(23)
NEED = (True, True, True, False, False)


@pytest.fixture(scope="module")
def kernels():
    if not compiled.wait(["norm_train"], timeout=900):
        pytest.skip(f"compiled kernels unavailable: {compiled.status()['modules']}")
    for k in ("bn_stats", "bn_norm", "bn_grad_sums", "bn_grad_dx", "ln_grad"):
        assert compiled.kernel(f"norm_train.{k}") is not None


def _case(shape, offset=0.0, spread=2.0):
    c = shape[1]
    x = (RNG.standard_normal(shape) * spread + offset).astype(np.float32)
    p = dict(scale=RNG.uniform(0.5, 1.5, c).astype(np.float32),
             bias=RNG.standard_normal(c).astype(np.float32),
             mean=RNG.standard_normal(c).astype(np.float32),
             var=RNG.uniform(0.5, 2.0, c).astype(np.float32))
    g = RNG.standard_normal(shape).astype(np.float32)
    return x, p, g


def _step(x, p, g, eps=1e-3, momentum=0.8):
    """(forward outputs, gradients) of training BatchNormalization, as the tape runs them."""
    outs = rn.batchnorm_train(x, p["scale"], p["bias"], p["mean"], p["var"], epsilon=eps,
                              momentum=momentum)
    ctx = GradContext("BatchNormalization", 15, NEED, np)
    grads = rn.batch_norm_grad(ctx, [g, None, None], [x, p["scale"], p["bias"], p["mean"],
                                                      p["var"]], list(outs), epsilon=eps,
                               training_mode=1)
    return outs, grads[:3]


def _close(got, ref, tol):
    for i, (a, b) in enumerate(zip(got, ref)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, i
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * scale, err_msg=f"output {i}")


@pytest.mark.parametrize("shape", [
    (1, 3, 5, 7),        # one image, odd sizes
    (3, 5, 4),           # 1-D BatchNorm (N, C, L)
    (2, 7, 9, 11),
    (2, 4, 1, 1),        # one element per row (the statistics are the batch's)
    (4, 6, 33, 34),      # rows split over the engine's threads
], ids=str)
def test_bn_training_matches_numpy(kernels, shape):
    x, p, g = _case(shape)
    with compiled.disabled():
        ref_outs, ref_grads = _step(x, p, g)
    outs, grads = _step(x, p, g)
    assert all(a.dtype == b.dtype for a, b in zip(outs, ref_outs))
    _close(outs, ref_outs, 2e-6)
    _close(grads, ref_grads, 2e-5)
    # the spec's running statistics: momentum times the old value plus (1 - momentum) times
    # the batch mean and the biased batch variance
    axes = (0,) + tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(outs[1], 0.8 * p["mean"] + 0.2 * x64.mean(axis=axes),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[2], 0.8 * p["var"] + 0.2 * x64.var(axis=axes),
                               rtol=1e-5, atol=1e-6)


def test_bn_training_gradients_match_float64(kernels):
    """The compiled float32 step against the numpy path run in float64 (the gradient rule
    itself is checked numerically in float64 by tests/autograd/test_grad_rules.py)."""
    x, p, g = _case((3, 4, 6, 5))
    outs, grads = _step(x, p, g)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    ref_outs, ref_grads = _step(x.astype(np.float64), p64, g.astype(np.float64))
    _close(outs[:3], ref_outs[:3], 2e-6)
    _close(grads, ref_grads, 2e-5)


def test_bn_training_large_offset_and_nan(kernels):
    # a common offset 1e4 times the spread: per-row float64 statistics keep the variance
    x, p, g = _case((2, 3, 8, 8), offset=3e4, spread=3.0)
    outs, _ = _step(x, p, g)
    axes = (0, 2, 3)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(axis=axes, keepdims=True)) / np.sqrt(
        x64.var(axis=axes, keepdims=True) + 1e-3)
    want = want * p["scale"].reshape(1, 3, 1, 1) + p["bias"].reshape(1, 3, 1, 1)
    np.testing.assert_allclose(outs[0], want, rtol=0, atol=2e-3)
    # NaN in one channel: that channel's output and gradients are NaN, the others are not
    x, p, g = _case((2, 3, 4, 4))
    x[1, 1, 2, 2] = np.nan
    with compiled.disabled():
        ref_outs, ref_grads = _step(x, p, g)
    outs, grads = _step(x, p, g)
    for a, b in zip(list(outs) + list(grads), list(ref_outs) + list(ref_grads)):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    assert np.isnan(outs[0][:, 1]).all() and not np.isnan(outs[0][:, [0, 2]]).any()


def test_bn_training_falls_back_to_numpy(kernels):
    """float64, non-contiguous inputs and the compiled-off switch take the numpy path."""
    x, p, g = _case((2, 3, 5, 5))
    calls = []
    real = rn._bn_train_compiled

    def spy(*a, **k):
        got = real(*a, **k)
        if got is not None:
            calls.append(1)
        return got
    rn._bn_train_compiled = spy
    try:
        _step(x.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()},
              g.astype(np.float64))
        _step(np.asfortranarray(x), p, g)
        with compiled.disabled():
            outs, _ = _step(x, p, g)
        assert not calls
        _step(x, p, g)
        assert calls
    finally:
        rn._bn_train_compiled = real


def _ln_grads(x, scale, bias, g, axis=-1, need=(True, True, True)):
    ctx = GradContext("LayerNormalization", 17, need, np)
    ins = [x, scale] + ([bias] if bias is not None else [])
    return rn.layer_norm_grad(ctx, [g], ins, [None], axis=axis, epsilon=1e-5)


@pytest.mark.parametrize("shape,axis,need", [
    ((3, 5, 7), -1, (True, True, True)),        # odd row length: every vector tail
    ((1, 1, 13), -1, (True, True, True)),       # one row
    ((2, 3, 4, 5), 2, (True, True, True)),      # two normalised axes, a (4, 5) scale
    ((64, 300), -1, (False, True, True)),       # rows split over chunks, no dx
    ((6, 33), -1, (True, False, False)),        # dx only
], ids=str)
def test_layer_norm_grad_matches_numpy(kernels, shape, axis, need):
    x = (RNG.standard_normal(shape) * 3 + 2).astype(np.float32)
    ax = axis % len(shape)
    scale = RNG.uniform(0.5, 1.5, shape[ax:]).astype(np.float32)
    bias = RNG.standard_normal(shape[ax:]).astype(np.float32)
    g = RNG.standard_normal(shape).astype(np.float32)
    with compiled.disabled():
        ref = _ln_grads(x, scale, bias, g, axis, need)
    got = _ln_grads(x, scale, bias, g, axis, need)
    for a, b, wanted in zip(got, ref, need):
        assert (a is None) == (not wanted) and (b is None) == (not wanted)
        if wanted:
            assert a.dtype == b.dtype == np.float32
            _close([a], [b], 2e-5)
    ref64 = _ln_grads(x.astype(np.float64), scale.astype(np.float64), bias.astype(np.float64),
                      g.astype(np.float64), axis, need)
    _close([a for a in got if a is not None], [b for b in ref64 if b is not None], 2e-5)


def test_layer_norm_grad_nan_and_no_bias(kernels):
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    x[2, 3] = np.nan
    scale = RNG.uniform(0.5, 1.5, 9).astype(np.float32)
    g = RNG.standard_normal((4, 9)).astype(np.float32)
    with compiled.disabled():
        ref = _ln_grads(x, scale, None, g, need=(True, True))
    got = _ln_grads(x, scale, None, g, need=(True, True))
    assert got[2] is None and ref[2] is None
    for a, b in zip(got[:2], ref[:2]):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(ref[0])
    np.testing.assert_allclose(got[0][ok], ref[0][ok], rtol=0,
                               atol=2e-5 * max(1, np.abs(ref[0][ok]).max()))
    # the NaN row poisons its own dx and every column of dscale, nothing else
    assert np.isnan(got[0][2]).all() and not np.isnan(got[0][[0, 1, 3]]).any()
    assert np.isnan(got[1]).all()
