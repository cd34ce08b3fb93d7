"""Normalization kernels against numpy formulas written here."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(2)


def run(op, *inputs, opset=22, n_outputs=1, training=False, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs,
                                training=training)
    return entry.fn(*inputs, **kw)


def bn_params(C, dtype=np.float32):
    return (RNG.standard_normal(C).astype(dtype), RNG.standard_normal(C).astype(dtype),
            RNG.standard_normal(C).astype(dtype), RNG.random(C).astype(dtype) + 0.5)


# --------------------------------------------------------------------------------------------
# BatchNormalization
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [6, 7, 9, 14, 15])
@pytest.mark.parametrize("eps", [1e-5, 0.37, 2.0, 1e-12])
def test_batch_norm_inference_any_epsilon(opset, eps):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    s, b, m, v = bn_params(3)
    y = run("BatchNormalization", x, s, b, m, v, opset=opset, epsilon=eps)
    r = lambda a: a.reshape(1, 3, 1, 1)  # noqa: E731
    ref = (x - r(m)) / np.sqrt(r(v) + np.float32(eps)) * r(s) + r(b)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_batch_norm_opset7_spatial0_per_activation():
    x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
    s, b, m, v = (RNG.standard_normal((3, 2, 2)).astype(np.float32) for _ in range(4))
    v = np.abs(v) + 0.1
    y = run("BatchNormalization", x, s, b, m, v, opset=7, spatial=0, epsilon=1e-3)
    ref = (x - m) / np.sqrt(v + np.float32(1e-3)) * s + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # training statistics per activation (reduced over the batch only)
    y2, rm, rv, sm, sv = run("BatchNormalization", x, s, b, m, v, opset=7, spatial=0,
                             n_outputs=5, momentum=0.8)
    mu, var = x.mean(0), x.var(0)
    np.testing.assert_allclose(y2, (x - mu) / np.sqrt(var + 1e-5) * s + b, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(rm, m * 0.8 + mu * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sm, mu, rtol=1e-5, atol=1e-6)
    assert rv.shape == sv.shape == (3, 2, 2)


def test_batch_norm_opset7_spatial1_and_is_test():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    s, b, m, v = bn_params(3)
    ref = (x - m[:, None]) / np.sqrt(v[:, None] + 1e-5) * s[:, None] + b[:, None]
    np.testing.assert_allclose(run("BatchNormalization", x, s, b, m, v, opset=7, spatial=1),
                               ref, rtol=1e-5, atol=1e-5)
    # opset 6: is_test=1 means inference even if training outputs are requested
    y = run("BatchNormalization", x, s, b, m, v, opset=6, is_test=1, n_outputs=1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [14, 15])
def test_batch_norm_training_mode_running_stats(opset):
    x = RNG.standard_normal((5, 3, 4, 4)).astype(np.float32)
    s, b, m, v = bn_params(3)
    y, rm, rv = run("BatchNormalization", x, s, b, m, v, opset=opset, n_outputs=3,
                    training_mode=1, momentum=0.7, epsilon=1e-2)
    mu = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))  # population variance
    r = lambda a: a.reshape(1, 3, 1, 1)  # noqa: E731
    np.testing.assert_allclose(y, (x - r(mu)) / np.sqrt(r(var) + 1e-2) * r(s) + r(b),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rm, m * 0.7 + mu * 0.3, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, v * 0.7 + var * 0.3, rtol=1e-5, atol=1e-6)
    # training_mode without the optional outputs still normalizes with batch statistics
    y1 = run("BatchNormalization", x, s, b, m, v, opset=opset, training_mode=1, epsilon=1e-2)
    np.testing.assert_allclose(y1, y, rtol=1e-6)


def test_batch_norm_float16_with_float32_stats():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float16)
    s, b = (a.astype(np.float16) for a in bn_params(3)[:2])
    m, v = bn_params(3)[2:]
    y = run("BatchNormalization", x, s, b, m, v, opset=15)
    assert y.dtype == np.float16
    xf = x.astype(np.float32)
    ref = (xf - m[:, None]) / np.sqrt(v[:, None] + 1e-5) * s[:, None].astype(np.float32) \
        + b[:, None].astype(np.float32)
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def test_batch_norm_bad_param_shape():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="scale"):
        run("BatchNormalization", x, np.ones(4, np.float32), *bn_params(3)[1:])


# --------------------------------------------------------------------------------------------
# Instance / Layer / Group / RMS
# --------------------------------------------------------------------------------------------

def test_instance_norm():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    s, b = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    y = run("InstanceNormalization", x, s, b, epsilon=1e-3)
    mu = x.mean(axis=(2, 3), keepdims=True)
    var = x.var(axis=(2, 3), keepdims=True)
    ref = (x - mu) / np.sqrt(var + 1e-3) * s.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
def test_layer_norm_outputs(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    a = axis % 3
    shape = x.shape[a:]
    s = RNG.standard_normal(shape).astype(np.float32)
    b = RNG.standard_normal(shape).astype(np.float32)
    y, mean, inv = run("LayerNormalization", x, s, b, opset=17, axis=axis, n_outputs=3,
                       epsilon=1e-3)
    axes = tuple(range(a, 3))
    mu = x.mean(axis=axes, keepdims=True)
    sd = np.sqrt(x.var(axis=axes, keepdims=True) + 1e-3)
    np.testing.assert_allclose(y, (x - mu) / sd * s + b, rtol=1e-5, atol=1e-5)
    assert mean.shape == x.shape[:a] + (1,) * (3 - a) and mean.dtype == np.float32
    np.testing.assert_allclose(inv, 1 / sd, rtol=1e-5)
    # B is optional
    y2 = run("LayerNormalization", x, s, None, opset=17, axis=axis, epsilon=1e-3)
    np.testing.assert_allclose(y2, (x - mu) / sd * s, rtol=1e-5, atol=1e-5)


def test_layer_norm_float16_and_axis_error():
    x = RNG.standard_normal((2, 8)).astype(np.float16)
    s = np.ones(8, np.float16)
    y, mean, inv = run("LayerNormalization", x, s, opset=17, n_outputs=3)
    assert y.dtype == np.float16 and mean.dtype == np.float32 and inv.dtype == np.float32
    with pytest.raises(InputError, match="axis"):
        run("LayerNormalization", x, s, opset=17, axis=2)


def test_group_norm_18_vs_21_scale_shapes():
    N, C, G = 2, 6, 3
    x = RNG.standard_normal((N, C, 4, 4)).astype(np.float32)
    xg = x.reshape(N, G, -1)
    norm = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5))
    norm = norm.reshape(x.shape)
    # opset 18: one scale/bias per group
    sg, bg = RNG.standard_normal(G).astype(np.float32), RNG.standard_normal(G).astype(np.float32)
    y18 = run("GroupNormalization", x, sg, bg, opset=18, num_groups=G)
    ref18 = norm * np.repeat(sg, C // G).reshape(1, C, 1, 1) + \
        np.repeat(bg, C // G).reshape(1, C, 1, 1)
    np.testing.assert_allclose(y18, ref18, rtol=1e-5, atol=1e-5)
    # opset 21: one scale/bias per channel
    sc, bc = RNG.standard_normal(C).astype(np.float32), RNG.standard_normal(C).astype(np.float32)
    y21 = run("GroupNormalization", x, sc, bc, opset=21, num_groups=G)
    ref21 = norm * sc.reshape(1, C, 1, 1) + bc.reshape(1, C, 1, 1)
    np.testing.assert_allclose(y21, ref21, rtol=1e-5, atol=1e-5)
    # per-group scale is wrong at 21
    with pytest.raises(ShapeError, match="per channel"):
        run("GroupNormalization", x, sg, bg, opset=21, num_groups=G)
    # per-channel scale at 18 (common in exported models) is accepted
    np.testing.assert_allclose(run("GroupNormalization", x, sc, bc, opset=18, num_groups=G),
                               ref21, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="divide"):
        run("GroupNormalization", x, sc, bc, opset=21, num_groups=4)


def test_rms_norm():
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    s = RNG.standard_normal(8).astype(np.float32)
    y = run("RMSNormalization", x, s, opset=23, epsilon=1e-4)
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-4) * s
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    s2 = RNG.standard_normal((3, 8)).astype(np.float32)
    y2 = run("RMSNormalization", x, s2, opset=23, axis=1)
    ref2 = x / np.sqrt((x * x).mean(axis=(1, 2), keepdims=True) + 1e-5) * s2
    np.testing.assert_allclose(y2, ref2, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# LRN, LpNormalization, MVN
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_lrn_vs_loop(size):
    x = RNG.standard_normal((2, 7, 3, 3)).astype(np.float32)
    alpha, beta, bias = 2e-3, 0.6, 1.5
    y = run("LRN", x, size=size, alpha=alpha, beta=beta, bias=bias)
    ref = np.empty_like(x)
    for c in range(7):
        lo = max(0, c - (size - 1) // 2)
        hi = min(6, c + int(np.ceil((size - 1) / 2)))
        sq = (x[:, lo:hi + 1] ** 2).sum(axis=1)
        ref[:, c] = x[:, c] / (bias + alpha / size * sq) ** beta
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization(p):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    x[1] = 0
    y = run("LpNormalization", x, p=p, axis=-1)
    norm = np.abs(x).sum(-1, keepdims=True) if p == 1 else np.sqrt((x * x).sum(-1,
                                                                                keepdims=True))
    ref = np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm))
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    assert not np.isnan(y).any()
    y0 = run("LpNormalization", x, p=p, axis=0)
    assert y0.shape == x.shape
    with pytest.raises(InputError, match="p=3"):
        run("LpNormalization", x, p=3)


def test_mean_variance_normalization():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y = run("MeanVarianceNormalization", x, opset=13)
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    sd = x.std(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / (sd + 1e-9), rtol=1e-4, atol=1e-5)
    y2 = run("MeanVarianceNormalization", x, opset=9, axes=[-1])
    mu2, sd2 = x.mean(-1, keepdims=True), x.std(-1, keepdims=True)
    np.testing.assert_allclose(y2, (x - mu2) / (sd2 + 1e-9), rtol=1e-4, atol=1e-5)
