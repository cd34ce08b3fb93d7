"""Elementwise math kernels against numpy expectations written here."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from workbench.arrays import to_numpy
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import attribute_defaults, lookup
from workbench.ops.sequence_repr import NONE_OPTIONAL

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

try:  # the same tests run on the GPU where cupy is installed
    import cupy

    XPS = [np, cupy]
except Exception:  # pragma: no cover - depends on the machine
    XPS = [np]

FLOATS = [np.float16, np.float32, np.float64]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
RNG = np.random.default_rng(0)


@pytest.fixture(params=XPS, ids=lambda m: m.__name__)
def xp(request):
    return request.param


def run(op, *inputs, opset=21, **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    return lookup(op, "", opset).fn(*inputs, **kw)


def rand(shape, dtype, lo=-5, hi=5):
    dtype = np.dtype(dtype)
    if dtype.kind == "u":
        lo = max(lo, 0)
    if dtype.kind in "iu":
        return RNG.integers(lo, hi, shape).astype(dtype)
    return RNG.uniform(lo, hi, shape).astype(dtype)


# --------------------------------------------------------------------------------------------
# binary arithmetic


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op,fn", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)])
def test_arithmetic_broadcasts_and_keeps_dtype(xp, op, fn, dtype):
    a, b = rand((2, 3, 4), dtype), rand((3, 1), dtype)
    got = run(op, xp.asarray(a), xp.asarray(b))
    assert got.dtype == dtype and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(to_numpy(got), fn(a, b))


def test_arithmetic_scalars_give_0d_arrays_and_empty_tensors_work(xp):
    got = run("Add", xp.asarray(np.float32(1.5)), xp.asarray(np.float32(2)))
    assert got.shape == () and got.dtype == np.float32 and float(got) == 3.5
    assert run("Mul", xp.zeros((0, 3), np.int64), xp.ones((3,), np.int64)).shape == (0, 3)
    assert run("Div", xp.zeros((2, 0), np.int32), xp.ones((1,), np.int32)).shape == (2, 0)


def test_bfloat16_arithmetic_stays_bfloat16():
    a = np.array([1.5, -2, 3], ml_dtypes.bfloat16)
    for op in ("Add", "Sub", "Mul", "Div", "Pow"):
        assert run(op, a, a).dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_integer_div_truncates_toward_zero(xp, dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1], dtype)
    b = np.array([2, 2, -2, -2, 3, 3, 5, -3], dtype)
    got = run("Div", xp.asarray(a), xp.asarray(b))
    assert got.dtype == dtype
    np.testing.assert_array_equal(to_numpy(got), [3, -3, -3, 3, 2, -2, 0, 0])


def test_int64_div_beyond_double_precision_is_exact():
    a = np.array([2**62 + 1, -(2**62) - 3, 9007199254740993], np.int64)
    b = np.array([3, 7, -2], np.int64)
    expected = [abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
                for x, y in zip(a.tolist(), b.tolist())]
    np.testing.assert_array_equal(run("Div", a, b), expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_unsigned_div(dtype):
    a, b = np.array([7, 200, 5], dtype), np.array([2, 3, 9], dtype)
    np.testing.assert_array_equal(run("Div", a, b), [3, 66, 0])


def test_float_div_by_zero_gives_inf_without_warnings(xp):
    got = to_numpy(run("Div", xp.asarray([1.0, -1.0, 0.0], np.float32),
                       xp.zeros((3,), np.float32)))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


def test_legacy_broadcast_opset6():
    a, b = rand((2, 3, 4), np.float32), rand((3,), np.float32)
    np.testing.assert_allclose(run("Add", a, b, opset=6, broadcast=1, axis=1),
                               a + b[:, None])
    np.testing.assert_allclose(run("Mul", a, rand((4,), np.float32), opset=6, broadcast=1).shape,
                               (2, 3, 4))
    with pytest.raises(ShapeError, match="legacy broadcast"):
        run("Sub", a, rand((5,), np.float32), opset=6, broadcast=1, axis=1)


# --------------------------------------------------------------------------------------------
# Pow, Mod


@pytest.mark.parametrize("xd,yd", [(np.float32, np.int64), (np.float32, np.int32),
                                   (np.float32, np.uint32), (np.float16, np.float32),
                                   (np.float64, np.float32), (np.int64, np.float32),
                                   (np.int32, np.int32), (np.int64, np.int64)])
def test_pow_mixed_types_keeps_base_dtype(xp, xd, yd):
    x, y = np.array([1, 2, 3], xd), np.array([4, 5, 6], yd)
    got = run("Pow", xp.asarray(x), xp.asarray(y))
    assert got.dtype == xd
    np.testing.assert_array_equal(to_numpy(got), np.array([1, 32, 729], xd))


def test_pow_integer_negative_exponent_truncates():
    x = np.array([2, -2, 1, -1, -1, 3], np.int64)
    y = np.array([-1, -1, -3, -3, -2, 2], np.int64)
    np.testing.assert_array_equal(run("Pow", x, y), [0, 0, 1, -1, 1, 9])


def test_pow_float_fractional_exponent(xp):
    x = np.array([4.0, 9.0, 2.0], np.float32)
    got = to_numpy(run("Pow", xp.asarray(x), xp.asarray(np.float32(0.5))))
    np.testing.assert_allclose(got, [2, 3, math.sqrt(2)], rtol=1e-6)


def test_mod_sign_semantics(xp):
    a = np.array([-4, 7, 5, 4, -7, 8], np.int32)
    b = np.array([2, -3, 8, -2, 3, 5], np.int32)
    np.testing.assert_array_equal(to_numpy(run("Mod", xp.asarray(a), xp.asarray(b))),
                                  [0, -2, 5, 0, 2, 3])  # sign of B
    np.testing.assert_array_equal(to_numpy(run("Mod", xp.asarray(a), xp.asarray(b), fmod=1)),
                                  [0, 1, 5, 0, -1, 3])  # sign of A
    af, bf = a.astype(np.float64) + 0.5, b.astype(np.float64)
    np.testing.assert_allclose(to_numpy(run("Mod", xp.asarray(af), xp.asarray(bf), fmod=1)),
                               np.fmod(af, bf))


def test_mod_float_edge_cases_opset28():
    x = np.array([-0.0, 0.0, np.inf, 5.0, 5.0, -5.0, np.nan, 3.0], np.float32)
    y = np.array([2.0, -2.0, 3.0, 0.0, -np.inf, -np.inf, 1.0, np.nan], np.float32)
    got = run("Mod", x, y, opset=28)
    assert np.signbit(got[0]) == np.signbit(np.float32(2.0))  # +-0 takes the sign of y
    assert np.signbit(got[1])
    assert np.isnan(got[2]) and np.isnan(got[3]) and np.isnan(got[6]) and np.isnan(got[7])
    assert got[4] == -np.inf and got[5] == -5.0


# --------------------------------------------------------------------------------------------
# unary math


UNARY = [("Neg", np.negative), ("Abs", np.abs), ("Sqrt", np.sqrt), ("Exp", np.exp),
         ("Log", np.log), ("Reciprocal", np.reciprocal), ("Floor", np.floor),
         ("Ceil", np.ceil), ("Sign", np.sign), ("Sin", np.sin), ("Cos", np.cos),
         ("Tan", np.tan), ("Atan", np.arctan), ("Sinh", np.sinh), ("Cosh", np.cosh),
         ("Asinh", np.arcsinh), ("Tanh", np.tanh)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op,fn", UNARY)
def test_unary_float(xp, op, fn, dtype):
    x = rand((3, 4), dtype, 0.1, 3)
    got = run(op, xp.asarray(x))
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), fn(x).astype(np.float64),
                               rtol=2e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.parametrize("op,fn,lo,hi", [("Asin", np.arcsin, -0.9, 0.9),
                                         ("Acos", np.arccos, -0.9, 0.9),
                                         ("Atanh", np.arctanh, -0.9, 0.9),
                                         ("Acosh", np.arccosh, 1.1, 5)])
def test_inverse_trig(xp, op, fn, lo, hi):
    x = rand((10,), np.float32, lo, hi)
    np.testing.assert_allclose(to_numpy(run(op, xp.asarray(x))), fn(x), rtol=1e-6)


def test_unary_outside_domain_gives_nan_quietly(xp):
    assert np.isnan(to_numpy(run("Sqrt", xp.asarray([-1.0], np.float32)))).all()
    assert to_numpy(run("Log", xp.asarray([0.0], np.float32)))[0] == -np.inf
    assert np.isnan(to_numpy(run("Asin", xp.asarray([2.0], np.float32)))).all()


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_unary(xp, dtype):
    x = np.array([-3, 0, 5], dtype)
    assert run("Neg", xp.asarray(x)).dtype == dtype
    np.testing.assert_array_equal(to_numpy(run("Abs", xp.asarray(x))), [3, 0, 5])
    np.testing.assert_array_equal(to_numpy(run("Sign", xp.asarray(x))), [-1, 0, 1])


def test_reciprocal_rejects_integers():
    with pytest.raises(InputError, match="Reciprocal"):
        run("Reciprocal", np.array([2], np.int32))


def test_round_half_to_even(xp):
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.4, 0.9, -4.5, np.nan, np.inf, -0.0], np.float32)
    got = to_numpy(run("Round", xp.asarray(x)))
    np.testing.assert_array_equal(got, [0, 2, 2, -0.0, -2, 2, 1, -4, np.nan, np.inf, -0.0])
    assert np.signbit(got[-1])


@pytest.mark.parametrize("dtype", FLOATS + [ml_dtypes.bfloat16])
def test_erf(dtype):
    x = np.array([-3, -1, -0.25, 0, 0.5, 1, 2.5], dtype)
    got = run("Erf", x)
    assert got.dtype == dtype
    expected = [math.erf(float(v)) for v in x.astype(np.float64)]
    np.testing.assert_allclose(got.astype(np.float64), expected,
                               rtol={2: 1e-2, 4: 1e-6, 8: 1e-12}[np.dtype(dtype).itemsize])


@pytest.mark.parametrize("dtype,ulps", [(np.float32, 2), (np.float64, 16)])
def test_erf_without_scipy(xp, dtype, ulps):
    from workbench.ops.elementwise import _erf_fallback

    x = np.concatenate([np.linspace(-7, 7, 4001), [0.0, -0.0, 1e-30, 1.9999999, 2.0]])
    x = x.astype(dtype)
    got = to_numpy(_erf_fallback(xp.asarray(x)))
    assert got.dtype == dtype
    expected = np.array([math.erf(v) for v in x.astype(np.float64)])
    np.testing.assert_allclose(got, expected, rtol=ulps * np.finfo(dtype).eps, atol=0)
    special = to_numpy(_erf_fallback(xp.asarray(np.array([np.nan, np.inf, -np.inf], dtype))))
    assert np.isnan(special[0]) and special[1] == 1 and special[2] == -1
    assert np.signbit(got[-4])  # erf(-0) = -0


def test_isnan_isinf(xp):
    x = xp.asarray(np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32))
    np.testing.assert_array_equal(to_numpy(run("IsNaN", x)), [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(to_numpy(run("IsInf", x)), [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(to_numpy(run("IsInf", x, detect_negative=0)), [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(to_numpy(run("IsInf", x, detect_positive=0)), [0, 0, 0, 1, 0])
    none = run("IsInf", x, detect_positive=0, detect_negative=0)
    assert none.dtype == bool and not to_numpy(none).any()


def test_isnan_float8():
    x = np.array([1.0, np.nan], ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(run("IsNaN", x), [False, True])


# --------------------------------------------------------------------------------------------
# variadic


@pytest.mark.parametrize("op,fn", [("Sum", np.add), ("Max", np.maximum), ("Min", np.minimum)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
def test_variadic_broadcasts(xp, op, fn, dtype):
    ins = [rand((3, 1, 4), dtype, 0, 9), rand((2, 1), dtype, 0, 9), rand((4,), dtype, 0, 9),
           rand((3, 2, 4), dtype, 0, 9)]
    got = run(op, *[xp.asarray(v) for v in ins])
    expected = fn(fn(fn(ins[0], ins[1]), ins[2]), ins[3])
    assert got.dtype == dtype and got.shape == (3, 2, 4)
    np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-6)


def test_variadic_single_input_and_mean(xp):
    x = xp.asarray(rand((2, 3), np.float32))
    for op in ("Sum", "Mean", "Max", "Min"):
        np.testing.assert_array_equal(to_numpy(run(op, x)), to_numpy(x))
    a, b, c = rand((2, 3), np.float32), rand((3,), np.float32), rand((1, 1), np.float32)
    got = run("Mean", xp.asarray(a), xp.asarray(b), xp.asarray(c))
    np.testing.assert_allclose(to_numpy(got), (a + b + c) / 3, rtol=1e-6)
    with pytest.raises(InputError):
        run("Sum")


def test_float16_sum_accumulates_in_float32():
    ins = [np.full((4,), v, np.float16) for v in (2048.0, 1.0, 1.0)]
    # in float16, 2048 + 1 rounds back to 2048 each time; the float32 accumulator gives 2050
    np.testing.assert_array_equal(run("Sum", *ins), np.full((4,), 2050, np.float16))
    assert run("Mean", *ins).dtype == np.float16


def test_max_min_propagate_nan():
    a = np.array([1.0, np.nan], np.float32)
    b = np.array([np.nan, 2.0], np.float32)
    assert np.isnan(run("Max", a, b)).all() and np.isnan(run("Min", a, b)).all()


# --------------------------------------------------------------------------------------------
# bitwise


@pytest.mark.parametrize("dtype", INTS)
def test_bitshift(xp, dtype):
    x = rand((6,), dtype, 0, 100)
    y = np.array([0, 1, 2, 3, 4, 5], dtype)
    left = run("BitShift", xp.asarray(x), xp.asarray(y), direction="LEFT")
    right = run("BitShift", xp.asarray(x), xp.asarray(y), direction="RIGHT")
    assert left.dtype == dtype and right.dtype == dtype
    np.testing.assert_array_equal(to_numpy(left), np.left_shift(x, y))
    np.testing.assert_array_equal(to_numpy(right), np.right_shift(x, y))


def test_bitshift_out_of_range_amounts(xp):
    x = xp.asarray(np.array([-8, -8, 8, 8, 1, -1], np.int8))
    y = xp.asarray(np.array([8, -1, 8, -1, 7, 9], np.int8))
    np.testing.assert_array_equal(to_numpy(run("BitShift", x, y, direction="RIGHT")),
                                  [-1, -1, 0, 0, 0, -1])
    np.testing.assert_array_equal(to_numpy(run("BitShift", x, y, direction="LEFT")),
                                  [0, 0, 0, 0, -128, 0])
    with pytest.raises(InputError, match="direction"):
        run("BitShift", x, y, direction="UP")


def test_bitwise_ops(xp):
    a = np.array([[0b1100, 0b1010]], np.int16)
    b = np.array([0b1010], np.int16)
    A, B = xp.asarray(a), xp.asarray(b)
    np.testing.assert_array_equal(to_numpy(run("BitwiseAnd", A, B)), a & b)
    np.testing.assert_array_equal(to_numpy(run("BitwiseOr", A, B)), a | b)
    np.testing.assert_array_equal(to_numpy(run("BitwiseXor", A, B)), a ^ b)
    np.testing.assert_array_equal(to_numpy(run("BitwiseNot", A)), ~a)
    assert run("BitwiseNot", xp.asarray(np.array([0], np.uint8))).tolist() == [255]


# --------------------------------------------------------------------------------------------
# Clip, Identity


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_clip_inputs(xp, dtype):
    x = rand((10,), dtype, -10, 10)
    lo, hi = np.array(2, dtype), np.array(6, dtype)
    got = run("Clip", xp.asarray(x), xp.asarray(lo), xp.asarray(hi))
    assert got.dtype == dtype
    np.testing.assert_array_equal(to_numpy(got), np.clip(x, 2, 6))
    np.testing.assert_array_equal(to_numpy(run("Clip", xp.asarray(x), None, xp.asarray(hi))),
                                  np.minimum(x, hi))
    np.testing.assert_array_equal(to_numpy(run("Clip", xp.asarray(x), xp.asarray(lo))),
                                  np.maximum(x, lo))
    np.testing.assert_array_equal(to_numpy(run("Clip", xp.asarray(x))), x)


def test_clip_min_greater_than_max_gives_max(xp):
    x = xp.asarray(np.array([-5.0, 0.0, 5.0], np.float32))
    got = run("Clip", x, xp.asarray(np.float32(3)), xp.asarray(np.float32(1)))
    np.testing.assert_array_equal(to_numpy(got), [1, 1, 1])


def test_clip_keeps_nan_and_rejects_tensor_bounds():
    got = run("Clip", np.array([np.nan, 5], np.float32), np.array(0, np.float32),
              np.array(1, np.float32))
    assert np.isnan(got[0]) and got[1] == 1
    with pytest.raises(ShapeError, match="scalar"):
        run("Clip", np.ones(3, np.float32), np.zeros(2, np.float32))


def test_clip_opset6_attributes():
    x = np.array([-np.inf, -5, 0, 5, np.inf], np.float32)
    np.testing.assert_array_equal(run("Clip", x, opset=6, min=-1.0, max=2.0), [-1, -1, 0, 2, 2])
    fmax = np.finfo(np.float32).max
    np.testing.assert_array_equal(run("Clip", x, opset=6), [-fmax, -5, 0, 5, fmax])
    h = np.array([-np.inf, 3, np.inf], np.float16)  # the float default bounds do not bind
    np.testing.assert_array_equal(run("Clip", h, opset=6, max=2.0), [-np.inf, 2, 2])


def test_identity_tensor_sequence_optional():
    x = np.arange(3)
    assert run("Identity", x) is x
    seq = [np.zeros(2), np.ones(3)]
    out = run("Identity", seq)
    assert isinstance(out, list) and out is not seq and all(a is b for a, b in zip(out, seq))
    assert run("Identity", NONE_OPTIONAL) is NONE_OPTIONAL
