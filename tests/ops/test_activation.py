"""Activation kernels against numpy formulas written here."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from workbench.arrays import to_numpy
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import attribute_defaults, lookup

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

try:  # the same tests run on the GPU where cupy is installed
    import cupy

    XPS = [np, cupy]
except Exception:  # pragma: no cover - depends on the machine
    XPS = [np]

RNG = np.random.default_rng(1)
FLOATS = [np.float16, np.float32, np.float64]


@pytest.fixture(params=XPS, ids=lambda m: m.__name__)
def xp(request):
    return request.param


def run(op, *inputs, opset=28, **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    return lookup(op, "", opset).fn(*inputs, **kw)


def tol(dtype):
    return {"rtol": 3e-3, "atol": 2e-3} if np.dtype(dtype).itemsize == 2 else \
        {"rtol": 1e-5, "atol": 1e-6}


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def _erf(x):
    return np.vectorize(math.erf)(x)


FORMULAS = {
    "Relu": ({}, lambda x: np.maximum(x, 0)),
    "LeakyRelu": ({"alpha": 0.1}, lambda x: np.where(x >= 0, x, 0.1 * x)),
    "Sigmoid": ({}, _sigmoid),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "Tanh": ({}, np.tanh),
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
    "Selu": ({}, lambda x: 1.0507009873554805 * np.where(
        x > 0, x, 1.6732632423543772 * (np.exp(x) - 1))),
    "Celu": ({"alpha": 2.0}, lambda x: np.maximum(0, x) + np.minimum(0, 2 * (np.exp(x / 2) - 1))),
    "Softplus": ({}, _softplus),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "ThresholdedRelu": ({"alpha": 0.5}, lambda x: np.where(x > 0.5, x, 0)),
    "Mish": ({}, lambda x: x * np.tanh(_softplus(x))),
    "Gelu": ({}, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    "Swish": ({"alpha": 1.5}, lambda x: x * _sigmoid(1.5 * x)),
    "Shrink": ({"bias": 0.5, "lambd": 1.0}, lambda x: np.where(
        x > 1.0, x - 0.5, np.where(x < -1.0, x + 0.5, 0))),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(FORMULAS))
def test_activation_formulas(xp, op, dtype):
    attrs, fn = FORMULAS[op]
    x = RNG.uniform(-6, 6, (3, 7)).astype(dtype)
    got = run(op, xp.asarray(x), **attrs)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), fn(x.astype(np.float64)),
                               **tol(dtype))


@pytest.mark.parametrize("op", sorted(FORMULAS))
def test_activations_keep_bfloat16_and_0d(op):
    attrs, fn = FORMULAS[op]
    x = np.array([-2.5, -0.5, 0.0, 0.75, 3.0], ml_dtypes.bfloat16)
    got = run(op, x, **attrs)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float64), fn(x.astype(np.float64)),
                               rtol=2e-2, atol=2e-2)
    scalar = run(op, np.asarray(np.float32(0.75)), **attrs)
    assert isinstance(scalar, np.ndarray) and scalar.shape == ()


def test_gelu_tanh_approximation(xp):
    x = RNG.uniform(-4, 4, (50,)).astype(np.float32)
    expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(to_numpy(run("Gelu", xp.asarray(x), approximate="tanh")),
                               expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="approximate"):
        run("Gelu", xp.asarray(x), approximate="fast")


def test_extremes_are_finite_and_exact(xp):
    x = xp.asarray(np.array([-1000, -100, -30, 0, 30, 100, 1000, np.inf, -np.inf], np.float32))
    s = to_numpy(run("Sigmoid", x))
    # (below -88 the float32 result flushes to 0 instead of a subnormal: error < 1.2e-38)
    np.testing.assert_allclose(s, _sigmoid(to_numpy(x).astype(np.float64)), rtol=1e-6,
                               atol=1.2e-38)
    assert s[0] == 0 and s[-2] == 1 and s[-1] == 0
    sp = to_numpy(run("Softplus", x))
    assert sp[-3] == 1000 and sp[0] == 0 and sp[-2] == np.inf and sp[-1] == 0
    np.testing.assert_allclose(sp[2], math.log1p(math.exp(-30)), rtol=1e-6)
    assert np.isfinite(to_numpy(run("Mish", x))[:-2]).all()
    assert np.isfinite(to_numpy(run("Swish", x))[:-2]).all()


def test_float16_sigmoid_tail_is_computed_in_float32():
    x = np.array([-14.0, -12.0], np.float16)
    # the results are float16 subnormals: exact to half a subnormal step (2**-25)
    np.testing.assert_allclose(run("Sigmoid", x).astype(np.float64),
                               _sigmoid(x.astype(np.float64)), rtol=1e-3, atol=2**-25)


def test_leaky_relu_alpha_above_one():
    x = np.array([-2.0, 3.0], np.float32)
    np.testing.assert_array_equal(run("LeakyRelu", x, alpha=2.0), [-4.0, 3.0])


def test_relu_and_shrink_integers():
    x = np.arange(-4, 5, dtype=np.int32)
    got = run("Relu", x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.maximum(x, 0))
    s = run("Shrink", x.astype(np.int8), bias=1.0, lambd=1.5)
    assert s.dtype == np.int8
    np.testing.assert_array_equal(s, [-3, -2, -1, 0, 0, 0, 1, 2, 3])


@pytest.mark.parametrize("slope_shape", [(1,), (4,), (3, 1), (2, 3, 4)])
def test_prelu_unidirectional_broadcast(xp, slope_shape):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    slope = RNG.standard_normal(slope_shape).astype(np.float32)
    got = run("PRelu", xp.asarray(x), xp.asarray(slope))
    np.testing.assert_allclose(to_numpy(got), np.where(x < 0, x * slope, x), rtol=1e-6)


def test_prelu_rejects_slope_that_does_not_broadcast_to_x():
    with pytest.raises(ShapeError, match="PRelu"):
        run("PRelu", np.ones((2, 3), np.float32), np.ones((2, 3, 1), np.float32))
    with pytest.raises(ShapeError, match="PRelu"):
        run("PRelu", np.ones((2, 3), np.float32), np.ones((2,), np.float32))


def test_prelu_integer():
    got = run("PRelu", np.array([-3, 2], np.int64), np.array([2], np.int64))
    assert got.dtype == np.int64 and got.tolist() == [-6, 2]


def test_swiglu(xp):
    a = RNG.standard_normal((2, 5)).astype(np.float32)
    b = RNG.standard_normal((2, 5)).astype(np.float32)
    got = run("SwiGLU", xp.asarray(a), xp.asarray(b), alpha=1.702)
    np.testing.assert_allclose(to_numpy(got), a * _sigmoid(1.702 * a) * b, rtol=1e-5)
    half = run("SwiGLU", a.astype(np.float16), b.astype(np.float16))
    assert half.dtype == np.float16
    with pytest.raises(ShapeError, match="same shape"):
        run("SwiGLU", xp.asarray(a), xp.asarray(b[:, :1]))


# --------------------------------------------------------------------------------------------
# Softmax family


def _softmax_np(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_softmax_13_is_per_axis(xp, axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    got = run("Softmax", xp.asarray(x), opset=13, axis=axis)
    np.testing.assert_allclose(to_numpy(got), _softmax_np(x, axis), rtol=1e-5)
    got = run("LogSoftmax", xp.asarray(x), opset=13, axis=axis)
    np.testing.assert_allclose(to_numpy(got), np.log(_softmax_np(x, axis)), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_softmax_before_13_coerces_to_2d(xp, axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float64)
    a = axis % 3
    flat = x.reshape(math.prod(x.shape[:a]), -1)
    expected = _softmax_np(flat, 1).reshape(x.shape)
    np.testing.assert_allclose(to_numpy(run("Softmax", xp.asarray(x), opset=11, axis=axis)),
                               expected, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(run("LogSoftmax", xp.asarray(x), opset=11, axis=axis)),
                               np.log(expected), rtol=1e-12)
    hard = np.zeros_like(flat)
    hard[np.arange(flat.shape[0]), flat.argmax(axis=1)] = 1
    np.testing.assert_array_equal(to_numpy(run("Hardmax", xp.asarray(x), opset=11, axis=axis)),
                                  hard.reshape(x.shape))


def test_softmax_default_axes_differ_by_opset():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run("Softmax", x, opset=13), _softmax_np(x, -1), rtol=1e-5)
    np.testing.assert_allclose(run("Softmax", x, opset=1),
                               _softmax_np(x.reshape(2, 12), 1).reshape(x.shape), rtol=1e-5)


def test_softmax_large_numbers_and_dtypes():
    x = np.array([[0, 1, 2, 3], [10000, 10001, 10002, 10003]], np.float32)
    got = run("Softmax", x)
    np.testing.assert_allclose(got[1], got[0], rtol=1e-6)
    assert np.isfinite(run("LogSoftmax", x)).all()
    for dtype in (np.float16, ml_dtypes.bfloat16):
        assert run("Softmax", x.astype(dtype)).dtype == dtype


def test_softmax_empty_and_bad_axis():
    assert run("Softmax", np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert run("Hardmax", np.zeros((2, 0), np.float32)).shape == (2, 0)
    with pytest.raises(InputError, match="axis 3"):
        run("Softmax", np.zeros((2, 3), np.float32), axis=3)


def test_hardmax_picks_first_maximum(xp):
    x = xp.asarray(np.array([[1, 3, 3, 0], [2, 2, 2, 2]], np.float32))
    got = run("Hardmax", x, opset=13)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(to_numpy(got), [[0, 1, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(to_numpy(run("Hardmax", x, opset=13, axis=0)),
                                  [[0, 1, 1, 0], [1, 0, 0, 1]])
