"""The CPU depthwise-convolution gradients (cache-blocked, threaded: ``ops.conv``) against a
brute-force loop over outputs and kernel taps, in float64: 1-D, 2-D, 3-D, strides, dilations,
asymmetric pads, kernels larger than the pads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from workbench.ops.conv import conv, depthwise_input_grad, depthwise_weight_grad

CASES = [  # x shape, kernel, strides, dilations, pads begin, pads end
    ((2, 5, 9, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
    ((2, 4, 11, 10), (3, 3), (2, 2), (1, 1), (1, 0), (0, 1)),
    ((1, 3, 12, 12), (3, 2), (2, 1), (2, 1), (0, 2), (1, 0)),
    ((3, 2, 7, 7), (5, 5), (1, 1), (1, 1), (2, 2), (2, 2)),
    ((2, 3, 10), (3,), (2,), (1,), (1,), (1,)),
    ((1, 2, 5, 6, 7), (3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
    ((8, 64, 28, 28), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),   # several blocks, threaded
]


def _brute(x, w, gy, k, s, d, pb):
    nd = len(k)
    ends = [max(0, (gy.shape[2 + a] - 1) * s[a] + (k[a] - 1) * d[a] + 1 - x.shape[2 + a]
                - pb[a]) for a in range(nd)]
    xpad = np.pad(x, [(0, 0), (0, 0)] + [(pb[a], ends[a]) for a in range(nd)])
    dw, dxp = np.zeros_like(w), np.zeros_like(xpad)
    for o in itertools.product(*[range(v) for v in gy.shape[2:]]):
        g = gy[(slice(None), slice(None)) + o]
        for t in itertools.product(*[range(v) for v in k]):
            idx = (slice(None), slice(None)) + tuple(o[a] * s[a] + t[a] * d[a]
                                                     for a in range(nd))
            dw[(slice(None), 0) + t] += (g * xpad[idx]).sum(0)
            dxp[idx] += g * w[(slice(None), 0) + t]
    crop = tuple(slice(pb[a], pb[a] + x.shape[2 + a]) for a in range(nd))
    return dw, dxp[(slice(None), slice(None)) + crop]


@pytest.mark.parametrize("xs,k,s,d,pb,pe", CASES, ids=[str(i) for i in range(len(CASES))])
def test_depthwise_gradients_match_brute_force(xs, k, s, d, pb, pe):
    r = np.random.default_rng(0)
    x = r.standard_normal(xs)
    C = xs[1]
    w = r.standard_normal((C, 1) + k)
    y = conv(x, w, None, group=C, strides=list(s), dilations=list(d), pads=list(pb) + list(pe))
    gy = r.standard_normal(y.shape)
    if x.size > 50_000:   # the brute force on one image is enough for the big case
        want_w, want_x = _brute(x[:1], w, gy[:1], k, s, d, pb)
        got_w = depthwise_weight_grad(x[:1], gy[:1], list(k), list(s), list(d), list(pb),
                                      list(pe))
        got_x = depthwise_input_grad(gy[:1], w, x[:1].shape, list(k), list(s), list(d),
                                     list(pb))
    else:
        want_w, want_x = _brute(x, w, gy, k, s, d, pb)
        got_w = depthwise_weight_grad(x, gy, list(k), list(s), list(d), list(pb), list(pe))
        got_x = depthwise_input_grad(gy, w, x.shape, list(k), list(s), list(d), list(pb))
    np.testing.assert_allclose(got_w, want_w, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-10, atol=1e-10)
