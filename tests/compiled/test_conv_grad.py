"""Compiled NCHW depthwise convolutions and their gradients (``kernels/conv_grad.py``) against
the numpy path (``compiled.disabled()``) and against PyTorch's autograd where torch is
installed."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import compiled
from workbench.autodiff.rules import conv as rc
from workbench.ops.registry import lookup

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def kernels():
    if not compiled.wait(["conv_grad"], timeout=900):
        pytest.skip(f"compiled kernels unavailable: {compiled.status()['modules']}")
    for kind in ("fwd", "dx", "dw"):
        for stride in ("s1", "s2"):
            assert compiled.kernel(f"conv_grad.dw_{kind}_{stride}") is not None


def _case(n, c, h, w, k, s, d, pb, pe):
    oh = (h + pb[0] + pe[0] - ((k[0] - 1) * d[0] + 1)) // s[0] + 1
    ow = (w + pb[1] + pe[1] - ((k[1] - 1) * d[1] + 1)) // s[1] + 1
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    gy = RNG.standard_normal((n, c, oh, ow)).astype(np.float32)
    wt = RNG.standard_normal((c, 1) + tuple(k)).astype(np.float32)
    return x, gy, wt


def _grads(x, gy, wt, k, s, d, pb, pe):
    c = x.shape[1]
    gx = rc._input_grad_plain(np, gy, wt, x.shape, c, k, s, d, pb, pe)
    gw = rc._weight_grad_plain(np, x, gy, wt.shape, c, k, s, d, pb, pe)
    return gx, gw


@pytest.mark.parametrize("n,c,h,w,k,s,d,pb,pe", [
    (2, 5, 9, 8, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),     # MobileNet's stride-1 layer
    (2, 5, 9, 8, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),     # and its stride-2 layer
    (1, 3, 10, 11, (5, 3), (3, 2), (2, 1), (0, 2), (1, 0)),   # asymmetric pads, dilation
    (3, 4, 7, 7, (3, 3), (1, 2), (1, 1), (2, 0), (0, 1)),     # stride 1 x 2
    (1, 2, 4, 5, (3, 3), (2, 1), (1, 1), (1, 1), (1, 1)),     # stride 2 x 1
])
def test_depthwise_grads_match_numpy(kernels, n, c, h, w, k, s, d, pb, pe):
    x, gy, wt = _case(n, c, h, w, k, s, d, pb, pe)
    with compiled.disabled():
        ref = _grads(x, gy, wt, k, s, d, pb, pe)
    got = _grads(x, gy, wt, k, s, d, pb, pe)
    for r, g in zip(ref, got):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=0, atol=2e-5 * max(1.0, np.abs(r).max()))


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_grads_empty_batch_and_nan(kernels, stride):
    k, s, d, pb, pe = (3, 3), (stride, stride), (1, 1), (1, 1), (1, 1)
    x, gy, wt = _case(0, 4, 6, 6, k, s, d, pb, pe)
    gx, gw = _grads(x, gy, wt, k, s, d, pb, pe)
    assert gx.shape == x.shape and not gw.any()
    x, gy, wt = _case(2, 4, 6, 6, k, s, d, pb, pe)
    gy[1, 2, 1, 1] = np.nan
    x[0, 1, 2, 2] = np.inf
    with compiled.disabled():
        ref = _grads(x, gy, wt, k, s, d, pb, pe)
    got = _grads(x, gy, wt, k, s, d, pb, pe)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(r))
        ok = np.isfinite(r)
        np.testing.assert_allclose(g[ok], r[ok], rtol=0, atol=2e-5 * max(1.0, np.abs(r[ok]).max()))


def test_depthwise_grads_match_torch(kernels):
    torch = pytest.importorskip("torch")
    k, s, d, pb, pe = (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)
    x, gy, wt = _case(2, 6, 9, 9, k, s, d, pb, pe)
    gx, gw = _grads(x, gy, wt, k, s, d, pb, pe)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(wt, requires_grad=True)
    y = torch.nn.functional.conv2d(tx, tw, stride=s, padding=1, groups=6)
    y.backward(torch.tensor(gy))
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("n,c,h,w,k,s,d,pads", [
    (2, 5, 9, 10, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
    (1, 3, 10, 11, (5, 3), (3, 2), (2, 1), [0, 2, 1, 0]),
    (1, 3, 10, 11, (3, 3), (1, 3), (1, 1), [1, 1, 1, 1]),     # stride 3: the numpy path
    (3, 4, 7, 7, (3, 3), (2, 2), (1, 1), [2, 0, 0, 1]),
    (0, 4, 7, 7, (3, 3), (1, 1), (1, 1), [1, 1, 1, 1]),
])
def test_depthwise_forward_matches_numpy(kernels, n, c, h, w, k, s, d, pads):
    conv = lookup("Conv", "", 11).fn
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    if x.size:
        x[0, 0, 1, 1] = np.nan
    wt = RNG.standard_normal((c, 1) + k).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    attrs = dict(group=c, strides=list(s), dilations=list(d), pads=pads)
    with compiled.disabled():
        ref = conv(x, wt, b, **attrs)
    got = conv(x, wt, b, **attrs)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    scale = max(1.0, np.abs(ref[ok]).max(initial=0))
    np.testing.assert_allclose(got[ok], ref[ok], rtol=0, atol=1e-5 * scale)
