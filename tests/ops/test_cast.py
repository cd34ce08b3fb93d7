"""Cast, CastLike and BitCast against the tables of the Cast spec, written out here."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as TP

from workbench.arrays import to_numpy
from workbench.errors import InputError, UnsupportedOperatorError
from workbench.ops.cast import cast_to
from workbench.ops.registry import attribute_defaults, lookup

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

try:  # the same tests run on the GPU where cupy is installed
    import cupy

    XPS = [np, cupy]
except Exception:  # pragma: no cover - depends on the machine
    XPS = [np]


@pytest.fixture(params=XPS, ids=lambda m: m.__name__)
def xp(request):
    return request.param


def run(op, *inputs, opset=25, **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    return lookup(op, "", opset).fn(*inputs, **kw)


def bits(a):
    return a.view(np.uint8).tolist()


# --------------------------------------------------------------------------------------------
# plain numeric types


def test_float_to_int_truncates_toward_zero(xp):
    x = xp.asarray(np.array([1.7, -1.7, 2.5, -2.5, 0.0, 126.9], np.float32))
    for to, dtype in [(TP.INT8, np.int8), (TP.INT32, np.int32), (TP.INT64, np.int64)]:
        got = run("Cast", x, to=to)
        assert got.dtype == dtype
        np.testing.assert_array_equal(to_numpy(got), [1, -1, 2, -2, 0, 126])


def test_int_to_narrower_int_keeps_low_bits(xp):
    x = xp.asarray(np.array([200, -200, 127, 256, -1], np.int16))
    np.testing.assert_array_equal(to_numpy(run("Cast", x, to=TP.INT8)), [-56, 56, 127, 0, -1])
    np.testing.assert_array_equal(to_numpy(run("Cast", x, to=TP.UINT8)), [200, 56, 127, 0, 255])


def test_bool_rules(xp):
    x = xp.asarray(np.array([0.0, -0.0, 0.5, -3, np.nan, np.inf], np.float32))
    np.testing.assert_array_equal(to_numpy(run("Cast", x, to=TP.BOOL)),
                                  [False, False, True, True, True, True])
    i = xp.asarray(np.array([0, 36, -1], np.int64))
    np.testing.assert_array_equal(to_numpy(run("Cast", i, to=TP.BOOL)), [False, True, True])
    b = xp.asarray(np.array([True, False]))
    assert to_numpy(run("Cast", b, to=TP.FLOAT)).tolist() == [1.0, 0.0]
    assert to_numpy(run("Cast", b, to=TP.INT64)).tolist() == [1, 0]


def test_float_narrowing_and_int_overflow_give_inf(xp):
    x = xp.asarray(np.array([1e10, -1e10, 1.0], np.float64))
    np.testing.assert_array_equal(to_numpy(run("Cast", x, to=TP.FLOAT16)), [np.inf, -np.inf, 1])
    big = xp.asarray(np.array([2**63 + 2**62], np.uint64))
    assert to_numpy(run("Cast", big, to=TP.FLOAT16))[0] == np.inf


def test_same_type_empty_and_scalar(xp):
    x = xp.asarray(np.arange(3, dtype=np.float32))
    assert run("Cast", x, to=TP.FLOAT) is x
    assert run("Cast", xp.zeros((0, 2), np.float32), to=TP.INT64).shape == (0, 2)
    s = run("Cast", xp.asarray(np.float64(2.75)), to=TP.INT32)
    assert s.shape == () and int(s) == 2


def test_bfloat16_round_trip():
    x = np.array([0.47892547, 1.0, -3.5, np.nan, np.inf], np.float32)
    b = run("Cast", x, to=TP.BFLOAT16)
    assert b.dtype == ml_dtypes.bfloat16
    back = run("Cast", b, to=TP.FLOAT)
    np.testing.assert_array_equal(back, [0.478515625, 1.0, -3.5, np.nan, np.inf])
    assert run("Cast", b, to=TP.INT32)[:3].tolist() == [0, 1, -3]


def test_cast_before_opset19_has_no_saturate_attribute():
    x = np.array([1e6], np.float32)
    assert "saturate" not in attribute_defaults("Cast", "", 13)
    assert run("Cast", x, opset=13, to=TP.FLOAT16)[0] == np.inf


@pytest.mark.parametrize("to", [TP.UNDEFINED, 99])
def test_unsupported_target_type(to):
    # every element type of onnx 1.23 has an array dtype (float4/6/8 and int2/4 through
    # ml_dtypes); an undefined or unknown one is refused with a clear error
    with pytest.raises(UnsupportedOperatorError, match="element type"):
        run("Cast", np.zeros(2, np.float32), to=to)


# --------------------------------------------------------------------------------------------
# float8


F8 = [(TP.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, 448.0),
      (TP.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz, 240.0),
      (TP.FLOAT8E5M2, ml_dtypes.float8_e5m2, 57344.0),
      (TP.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, 57344.0)]
SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e6, -1e6, 0.47892547], np.float32)


@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("to,dtype,fmax", F8)
def test_float8_saturate(src, to, dtype, fmax):
    with np.errstate(over="ignore"):  # 1e6 is inf in float16
        x = SPECIAL.astype(src)
    got = run("Cast", x, to=to)
    assert got.dtype == dtype
    f = got.astype(np.float32)
    uz = "fnuz" in np.dtype(dtype).name
    assert f[0] == 0 and f[1] == 0 and np.signbit(f[1]) != uz
    assert np.isnan(f[2])
    np.testing.assert_array_equal(f[3:7], [fmax, -fmax, fmax, -fmax])
    assert f[7] == (0.46875 if "e4m3" in np.dtype(dtype).name else 0.5)  # round to nearest


@pytest.mark.parametrize("to,dtype,fmax", F8)
def test_float8_no_saturate(to, dtype, fmax):
    f = run("Cast", SPECIAL, to=to, saturate=0).astype(np.float32)
    if to == TP.FLOAT8E5M2:  # the only one with infinities
        np.testing.assert_array_equal(f[3:7], [np.inf, -np.inf, np.inf, -np.inf])
    else:
        assert np.isnan(f[3:7]).all()
    assert np.isnan(f[2])


def test_float8_from_integers_and_back():
    x = np.array([0, 3, -17, 1000], np.int32)
    got = run("Cast", x, to=TP.FLOAT8E4M3FN)
    np.testing.assert_array_equal(got.astype(np.float32), [0, 3, -16, 448])
    np.testing.assert_array_equal(run("Cast", got, to=TP.INT32), [0, 3, -16, 448])
    np.testing.assert_array_equal(run("Cast", got, to=TP.FLOAT8E5M2).astype(np.float32),
                                  [0, 3, -16, 448])


@pytest.mark.parametrize("mode,expected", [
    ("up", [0, 124, 125, 126, 128, 128, 129, 130, 128]),
    ("down", [0, 123, 125, 126, 127, 128, 129, 130, 127]),
    ("nearest", [0, 124, 125, 126, 127, 128, 129, 130, 128]),
])
def test_e8m0_rounding(mode, expected):
    x = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0, 1.5], np.float32)
    got = run("Cast", x, opset=25, to=TP.FLOAT8E8M0, round_mode=mode)
    assert got.dtype == ml_dtypes.float8_e8m0fnu
    assert bits(got) == expected


def test_e8m0_special_values_and_saturation():
    x = np.array([np.nan, np.inf, 3e38, 1e-45, 0.0], np.float32)
    assert bits(run("Cast", x, to=TP.FLOAT8E8M0)) == [255, 254, 254, 0, 0]
    assert bits(run("Cast", x, to=TP.FLOAT8E8M0, saturate=0, round_mode="nearest")) == \
        [255, 255, 255, 255, 255]
    f64 = np.array([1.0 + 2.0**-40], np.float64)  # rounds up only when read as a double
    assert bits(run("Cast", f64, to=TP.FLOAT8E8M0)) == [128]
    with pytest.raises(InputError, match="round_mode"):
        run("Cast", x, to=TP.FLOAT8E8M0, round_mode="sideways")
    e = run("Cast", np.array([0.25, 4.0], np.float32), to=TP.FLOAT8E8M0)
    assert run("Cast", e, to=TP.FLOAT16).tolist() == [0.25, 4.0]


# --------------------------------------------------------------------------------------------
# 4-bit and 2-bit types


def test_int4_uint4_wrap_like_integers():
    x = np.arange(-9, 16).astype(np.float32)
    i4 = run("Cast", x, to=TP.INT4)
    u4 = run("Cast", x, to=TP.UINT4)
    assert i4.dtype == ml_dtypes.int4 and u4.dtype == ml_dtypes.uint4
    np.testing.assert_array_equal(i4.astype(np.int64), (np.arange(-9, 16) + 8) % 16 - 8)
    np.testing.assert_array_equal(u4.astype(np.int64), np.arange(-9, 16) % 16)
    np.testing.assert_array_equal(run("Cast", i4, to=TP.INT8), i4.astype(np.int8))
    np.testing.assert_array_equal(run("Cast", u4, to=TP.FLOAT16), u4.astype(np.float16))


def test_int2_uint2():
    x = np.arange(-3, 4).astype(np.float32)
    np.testing.assert_array_equal(run("Cast", x, to=TP.INT2).astype(np.int64),
                                  [1, -2, -1, 0, 1, -2, -1])
    np.testing.assert_array_equal(run("Cast", x, to=TP.UINT2).astype(np.int64),
                                  [1, 2, 3, 0, 1, 2, 3])


def test_float4e2m1_rounds_to_nearest_even_and_saturates():
    x = np.array([0.25, 0.75, 1.25, 2.5, -3.5, 9.0, -1e6, 0.01], np.float32)
    got = run("Cast", x, to=TP.FLOAT4E2M1)
    assert got.dtype == ml_dtypes.float4_e2m1fn
    np.testing.assert_array_equal(got.astype(np.float32), [0, 1, 1, 2, -4, 6, -6, 0])


# --------------------------------------------------------------------------------------------
# strings


def test_strings_to_floats():
    s = np.array(["1e-5", "1E8", "NaN", "nan", "INF", "+INF", "-INF", "inf", " 3.25 ", "-0"],
                 dtype=object)
    got = run("Cast", s, to=TP.FLOAT)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[[0, 1, 4, 5, 6, 7, 8]],
                                  np.array([1e-5, 1e8, np.inf, np.inf, -np.inf, np.inf, 3.25],
                                           np.float32))
    assert np.isnan(got[2]) and np.isnan(got[3]) and np.signbit(got[9])
    assert run("Cast", s[:2], to=TP.FLOAT16).dtype == np.float16


def test_strings_to_integers_and_bool():
    s = np.array(["0", "127", "128", "-129", "100.5", "9223372036854775807"], dtype=object)
    np.testing.assert_array_equal(run("Cast", s, to=TP.INT64),
                                  [0, 127, 128, -129, 100, 2**63 - 1])
    np.testing.assert_array_equal(run("Cast", s, to=TP.INT8), [0, 127, -128, 127, 100, -1])
    np.testing.assert_array_equal(run("Cast", s[:3], to=TP.UINT8), [0, 127, 128])
    b = np.array(["0", "1", "2", "True", "false", "0.0"], dtype=object)
    assert run("Cast", b, to=TP.BOOL).tolist() == [False, True, True, True, False, False]
    assert run("Cast", np.array([b"7"], dtype=object), to=TP.INT32).tolist() == [7]


def test_strings_to_narrow_types():
    s = np.array(["1000", "-INF", "0.5"], dtype=object)
    np.testing.assert_array_equal(run("Cast", s, to=TP.FLOAT8E4M3FN).astype(np.float32),
                                  [448, -448, 0.5])
    np.testing.assert_array_equal(run("Cast", s[2:], to=TP.BFLOAT16).astype(np.float32), [0.5])
    np.testing.assert_array_equal(run("Cast", np.array(["-1", "7"], dtype=object),
                                      to=TP.INT4).astype(np.int8), [-1, 7])


def test_bad_string_is_an_input_error():
    with pytest.raises(InputError, match="Hello"):
        run("Cast", np.array(["Hello World!"], dtype=object), to=TP.FLOAT)


def test_numbers_to_strings(xp):
    x = xp.asarray(np.array([0.47892547, 1.0, -2.5, 1e-7, np.nan, np.inf, -np.inf], np.float32))
    got = run("Cast", x, to=TP.STRING)
    assert isinstance(got, np.ndarray) and got.dtype == object
    assert got.tolist() == ["0.47892547", "1.0", "-2.5", "1e-07", "NaN", "INF", "-INF"]
    assert all(isinstance(v, str) for v in got.tolist())
    assert run("Cast", np.array([-3, 70000], np.int64), to=TP.STRING).tolist() == ["-3", "70000"]
    assert run("Cast", np.array([True, False]), to=TP.STRING).tolist() == ["1", "0"]
    # the text of a float32 reads back to the same float32
    r = RNG_VALUES.astype(np.float32)
    np.testing.assert_array_equal(run("Cast", run("Cast", r, to=TP.STRING), to=TP.FLOAT), r)


RNG_VALUES = np.random.default_rng(3).standard_normal(50) * 1000


# --------------------------------------------------------------------------------------------
# CastLike, BitCast


def test_castlike(xp):
    x = xp.asarray(np.array([1.9, -1.9], np.float32))
    got = run("CastLike", x, xp.asarray(np.zeros((0,), np.int16)))
    assert got.dtype == np.int16 and to_numpy(got).tolist() == [1, -1]
    s = run("CastLike", np.array([2.5], np.float64), np.array(["x"], dtype=object))
    assert s.tolist() == ["2.5"]
    f8 = run("CastLike", np.array([1e6], np.float32),
             np.zeros(1, ml_dtypes.float8_e4m3fn), saturate=0)
    assert np.isnan(f8.astype(np.float32)).all()


def test_bitcast(xp):
    x = xp.asarray(np.array([1.0, -2.0, 0.0], np.float32))
    got = run("BitCast", x, opset=26, to=TP.INT32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(to_numpy(got), np.array([1.0, -2.0, 0.0], np.float32)
                                  .view(np.int32))
    back = run("BitCast", got, opset=26, to=TP.FLOAT)
    np.testing.assert_array_equal(to_numpy(back), to_numpy(x))
    strided = xp.asarray(np.arange(12, dtype=np.int64).reshape(3, 4))[:, ::2]
    as_f64 = run("BitCast", strided, opset=26, to=TP.DOUBLE)
    assert as_f64.shape == (3, 2)
    np.testing.assert_array_equal(to_numpy(as_f64).view(np.int64), to_numpy(strided))
    s = run("BitCast", xp.asarray(np.float32(1.0)), opset=26, to=TP.UINT32)
    assert s.shape == () and int(s) == 0x3F800000


def test_bitcast_bool_and_subbyte():
    assert run("BitCast", np.array([True, False]), opset=26, to=TP.UINT8).tolist() == [1, 0]
    assert run("BitCast", np.array([0, 1, 7], np.uint8), opset=26, to=TP.BOOL).tolist() == \
        [False, True, True]
    i4 = np.array([-1, 7, -8], ml_dtypes.int4)
    u4 = run("BitCast", i4, opset=26, to=TP.UINT4)
    assert u4.dtype == ml_dtypes.uint4 and u4.astype(np.int64).tolist() == [15, 7, 8]


def test_bitcast_needs_equal_widths():
    with pytest.raises(InputError, match="widths must be equal"):
        run("BitCast", np.zeros(2, np.float32), opset=26, to=TP.INT64)
    with pytest.raises(InputError, match="widths must be equal"):
        run("BitCast", np.zeros(2, ml_dtypes.int4), opset=26, to=TP.INT8)
    with pytest.raises(InputError, match="string"):
        run("BitCast", np.array(["a"], dtype=object), opset=26, to=TP.INT8)


def test_cast_to_helper_docs_example():
    assert cast_to(np.array([1.7, -1.7]), TP.INT32).tolist() == [1, -1]
