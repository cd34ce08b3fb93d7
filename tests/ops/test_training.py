"""ai.onnx.preview.training optimizers against the pseudo code of their schemas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import attribute_defaults, lookup

DOMAIN = "ai.onnx.preview.training"
RNG = np.random.default_rng(0)


def run(op, *inputs, **attrs):
    entry = lookup(op, DOMAIN, 1)
    kw = dict(attribute_defaults(op, DOMAIN, 1))
    kw.update(attrs)
    return entry.fn(*inputs, **kw)


def scalars(r, t):
    return np.array(r, np.float32), np.array(t, np.int64)


@pytest.mark.parametrize("t", [0, 3])
def test_adagrad_two_tensors(t):
    xs = [RNG.standard_normal(3).astype(np.float32), RNG.standard_normal((2, 2))]
    gs = [RNG.standard_normal(3).astype(np.float32), RNG.standard_normal((2, 2))]
    hs = [np.abs(RNG.standard_normal(3)).astype(np.float32), np.abs(RNG.standard_normal((2, 2)))]
    out = run("Adagrad", *scalars(0.1, t), *xs, *gs, *hs, decay_factor=0.2, epsilon=1e-5,
              norm_coefficient=0.01)
    assert len(out) == 4
    r = 0.1 / (1 + t * 0.2)
    for i in range(2):
        g = 0.01 * xs[i] + gs[i]
        h = hs[i] + g * g
        np.testing.assert_allclose(out[i], xs[i] - r * g / (np.sqrt(h) + 1e-5), rtol=1e-5)
        np.testing.assert_allclose(out[2 + i], h, rtol=1e-6)
        assert out[i].dtype == xs[i].dtype and out[2 + i].dtype == hs[i].dtype


@pytest.mark.parametrize("t", [0, 1, 5])
def test_adam(t):
    x, g = RNG.standard_normal(4), RNG.standard_normal(4)
    v, h = RNG.standard_normal(4), np.abs(RNG.standard_normal(4))
    out = run("Adam", np.array(0.05), np.array(t, np.int64), x, g, v, h, alpha=0.9, beta=0.99,
              epsilon=1e-6, norm_coefficient=0.1, norm_coefficient_post=0.01)
    gr = 0.1 * x + g
    v_new = 0.9 * v + 0.1 * gr
    h_new = 0.99 * h + 0.01 * gr * gr
    lr = 0.05 * math.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t) if t > 0 else 0.05
    x_new = (1 - 0.01) * (x - lr * v_new / (np.sqrt(h_new) + 1e-6))
    for got, exp in zip(out, (x_new, v_new, h_new)):
        np.testing.assert_allclose(got, exp, rtol=1e-12)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum(mode, t):
    xs = [RNG.standard_normal(3), RNG.standard_normal(2)]
    gs = [RNG.standard_normal(3), RNG.standard_normal(2)]
    vs = [RNG.standard_normal(3), RNG.standard_normal(2)]
    out = run("Momentum", np.array(0.1), np.array(t, np.int64), *xs, *gs, *vs, alpha=0.9,
              beta=0.5, mode=mode, norm_coefficient=0.02)
    beta = 0.5 if t > 0 else 1.0
    for i in range(2):
        g = 0.02 * xs[i] + gs[i]
        v = 0.9 * vs[i] + beta * g
        x = xs[i] - 0.1 * v if mode == "standard" else xs[i] - 0.1 * (g + 0.9 * v)
        np.testing.assert_allclose(out[i], x, rtol=1e-12)
        np.testing.assert_allclose(out[2 + i], v, rtol=1e-12)


def test_training_errors():
    r, t = scalars(0.1, 0)
    with pytest.raises(InputError, match="groups"):
        run("Adagrad", r, t, np.ones(2), np.ones(2))
    with pytest.raises(ShapeError, match="same shape"):
        run("Momentum", r, t, np.ones(2), np.ones(3), np.ones(2), alpha=0.9, beta=1.0,
            mode="standard", norm_coefficient=0.0)
    with pytest.raises(InputError, match="mode"):
        run("Momentum", r, t, np.ones(2), np.ones(2), np.ones(2), alpha=0.9, beta=1.0,
            mode="adam", norm_coefficient=0.0)
