"""Comparison, boolean and Where kernels against numpy expectations written here."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from workbench.arrays import to_numpy
from workbench.errors import ShapeError
from workbench.ops.registry import attribute_defaults, lookup

try:  # the same tests run on the GPU where cupy is installed
    import cupy

    XPS = [np, cupy]
except Exception:  # pragma: no cover - depends on the machine
    XPS = [np]

RNG = np.random.default_rng(2)
DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64]


@pytest.fixture(params=XPS, ids=lambda m: m.__name__)
def xp(request):
    return request.param


def run(op, *inputs, opset=21, **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    return lookup(op, "", opset).fn(*inputs, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,fn", [("Equal", np.equal), ("Less", np.less),
                                   ("Greater", np.greater), ("LessOrEqual", np.less_equal),
                                   ("GreaterOrEqual", np.greater_equal)])
def test_comparisons_broadcast_to_bool(xp, op, fn, dtype):
    a = RNG.integers(0, 4, (2, 3, 4)).astype(dtype)
    b = RNG.integers(0, 4, (3, 1)).astype(dtype)
    got = run(op, xp.asarray(a), xp.asarray(b))
    assert got.dtype == bool and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(to_numpy(got), fn(a, b))


def test_comparisons_of_scalars_are_0d_arrays(xp):
    got = run("Less", xp.asarray(np.float32(1)), xp.asarray(np.float32(2)))
    assert got.shape == () and got.dtype == bool and bool(got)


def test_equal_strings_and_bools():
    a = np.array(["string1", "string2"], dtype=object)
    b = np.array(["string1", "string3"], dtype=object)
    got = run("Equal", a, b)
    assert got.dtype == bool and got.tolist() == [True, False]
    assert run("Equal", a, np.array(["string2"], dtype=object)).tolist() == [False, True]
    assert run("Equal", np.array([True, False]), np.array(True)).tolist() == [True, False]


def test_bfloat16_comparison():
    a = np.array([1, 2, 3], ml_dtypes.bfloat16)
    assert run("Greater", a, np.array(2, ml_dtypes.bfloat16)).tolist() == [False, False, True]


def test_nan_compares_false():
    a = np.array([np.nan, 1.0], np.float32)
    assert not run("Equal", a, a)[0] and not run("LessOrEqual", a, a)[0]


@pytest.mark.parametrize("op,fn", [("And", np.logical_and), ("Or", np.logical_or),
                                   ("Xor", np.logical_xor)])
def test_boolean_ops(xp, op, fn):
    a = RNG.random((3, 4, 5)) < 0.5
    b = RNG.random((4, 5)) < 0.5
    got = run(op, xp.asarray(a), xp.asarray(b))
    assert got.dtype == bool
    np.testing.assert_array_equal(to_numpy(got), fn(a, b))


def test_not(xp):
    a = RNG.random((3, 4)) < 0.5
    np.testing.assert_array_equal(to_numpy(run("Not", xp.asarray(a))), ~a)


def test_legacy_broadcast_opset1():
    a = RNG.random((2, 3, 4)) < 0.5
    b = RNG.random((3,)) < 0.5
    np.testing.assert_array_equal(run("And", a, b, opset=1, broadcast=1, axis=1),
                                  a & b[:, None])
    with pytest.raises(ShapeError):
        run("Less", np.ones((2, 3)), np.ones((4,)), opset=1, broadcast=1, axis=0)


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_where_broadcasts_three_ways(xp, dtype):
    cond = RNG.random((3, 1, 1)) < 0.5
    x = RNG.integers(0, 9, (1, 4, 1)).astype(dtype)
    y = RNG.integers(0, 9, (1, 1, 5)).astype(dtype)
    got = run("Where", xp.asarray(cond), xp.asarray(x), xp.asarray(y))
    assert got.dtype == np.dtype(dtype) and got.shape == (3, 4, 5)
    np.testing.assert_array_equal(to_numpy(got), np.where(cond, x, y))


def test_where_strings_scalars_and_empty():
    got = run("Where", np.array([True, False]), np.array(["a", "b"], dtype=object),
              np.array(["c"], dtype=object))
    assert got.tolist() == ["a", "c"]
    s = run("Where", np.array(False), np.array(1.5, np.float32), np.array(2.5, np.float32))
    assert isinstance(s, np.ndarray) and s.shape == () and s.dtype == np.float32 and s == 2.5
    e = run("Where", np.zeros((0, 2), bool), np.ones((2,), np.int64), np.zeros((1, 2), np.int64))
    assert e.shape == (0, 2) and e.dtype == np.int64
