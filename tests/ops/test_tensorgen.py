"""Tensor generators: Constant, ConstantOfShape, Range, EyeLike and the random ops."""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest
from onnx import TensorProto

from workbench.arrays import cupy_module, to_numpy
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """The array module the kernels run on (cupy only where it is installed)."""
    if request.param == "numpy":
        return np
    cp = cupy_module()
    if cp is None:
        pytest.skip("cupy is not installed")
    return cp


def run(op, *inputs, opset=21, n_outputs=1, rng=None, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext("n", op, opset, n_outputs, rng=rng)
    return entry.fn(*inputs, **kw)


MY_OPS = ["Constant", "ConstantOfShape", "Range", "EyeLike", "RandomNormal", "RandomUniform",
          "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"]


@pytest.mark.parametrize("op", MY_OPS)
def test_every_opset_from_7_has_a_kernel(op):
    versions = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                       if s.name == op and s.domain == ""})
    for opset in range(max(7, versions[0]), 29):
        assert lookup(op, "", opset) is not None


# Constant ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("attr, value, dtype, shape", [
    ("value", np.arange(6, dtype=np.float16).reshape(2, 3), np.float16, (2, 3)),
    ("sparse_value", np.eye(2, dtype=np.int32), np.int32, (2, 2)),
    ("value_float", 1.5, np.float32, ()),
    ("value_floats", [1.0, 2.0], np.float32, (2,)),
    ("value_int", 3, np.int64, ()),
    ("value_ints", [], np.int64, (0,)),
    ("value_string", "hi", object, ()),
    ("value_strings", ["a", "b"], object, (2,)),
])
def test_constant_attributes(attr, value, dtype, shape):
    out = run("Constant", **{attr: value})
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    np.testing.assert_array_equal(out, np.asarray(value, dtype=dtype).reshape(shape))


def test_constant_needs_exactly_one_value():
    with pytest.raises(InputError, match="exactly one"):
        run("Constant", value_int=1, value_float=2.0)
    with pytest.raises(InputError, match="none"):
        run("Constant")


def test_constant_of_shape(xp):
    out = run("ConstantOfShape", xp.asarray(np.array([2, 3], np.int64)))
    assert out.dtype == np.float32 and to_numpy(out).tolist() == [[0.0] * 3] * 2
    out = run("ConstantOfShape", xp.asarray(np.array([4], np.int64)),
              value=np.array([7], np.int32))
    assert out.dtype == np.int32 and to_numpy(out).tolist() == [7] * 4
    out = run("ConstantOfShape", xp.asarray(np.array([], np.int64)),
              value=np.array([True]))
    assert out.shape == () and bool(to_numpy(out))
    assert run("ConstantOfShape", np.array([0, 3], np.int64)).shape == (0, 3)
    with pytest.raises(ShapeError, match="one element"):
        run("ConstantOfShape", np.array([1], np.int64), value=np.array([1, 2]))


# Range / EyeLike ---------------------------------------------------------------------------------

@pytest.mark.parametrize("start, limit, delta, dtype", [
    (3, 9, 3, np.int32), (10, 4, -2, np.int64), (0, 0, 1, np.int16), (5, 1, 1, np.int64),
    (1.0, 5.0, 0.5, np.float32), (10.0, 6.0, -3.0, np.float64), (0.0, 1.0, 0.3, np.float64),
])
def test_range_matches_the_spec_formula(xp, start, limit, delta, dtype):
    args = [xp.asarray(np.array(v, dtype)) for v in (start, limit, delta)]
    out = run("Range", *args)
    n = max(int(np.ceil((limit - start) / delta)), 0)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(to_numpy(out), [start + i * delta for i in range(n)], rtol=1e-6)


def test_range_low_precision_uses_float32_unless_stash_type_0():
    args = [np.array(v, np.float16) for v in (2040.0, 2050.0, 1.0)]
    out = run("Range", *args, opset=27)
    assert out.dtype == np.float16 and out.shape == (10,)
    np.testing.assert_array_equal(out, np.arange(2040, 2050).astype(np.float16))
    out = run("Range", *[np.array(v, ml_dtypes.bfloat16) for v in (0.0, 4.0, 1.0)], opset=27)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16) and out.tolist() == [0, 1, 2, 3]
    out = run("Range", *args, opset=27, stash_type=0)
    assert out.dtype == np.float16 and out.shape == (10,)


def test_range_zero_delta_raises():
    with pytest.raises(InputError, match="delta"):
        run("Range", *[np.array(v, np.int64) for v in (0, 5, 0)])


@pytest.mark.parametrize("k", [-1, 0, 2, 5])
def test_eye_like(xp, k):
    out = run("EyeLike", xp.asarray(np.zeros((3, 4), np.int32)), k=k)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(to_numpy(out), np.eye(3, 4, k))
    out = run("EyeLike", np.zeros((2, 2), np.int32), dtype=TensorProto.DOUBLE)
    assert out.dtype == np.float64
    with pytest.raises(ShapeError, match="2-D"):
        run("EyeLike", np.zeros(3))


# Random ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, attrs", [
    ("RandomNormal", dict(shape=[3, 4], mean=2.0, scale=0.5)),
    ("RandomUniform", dict(shape=[3, 4], low=-1.0, high=3.0)),
])
def test_random_with_shape_attribute(op, attrs):
    out = run(op, **attrs)
    assert out.dtype == np.float32 and out.shape == (3, 4)
    out = run(op, dtype=TensorProto.DOUBLE, seed=3.0, **attrs)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, run(op, dtype=TensorProto.DOUBLE, seed=3.0, **attrs))
    if op == "RandomUniform":
        assert out.min() >= -1 and out.max() < 3


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike", "Bernoulli"])
def test_random_like_ops_follow_the_input(xp, op):
    x = xp.asarray(np.full((2, 5), 0.5, np.float16))
    out = run(op, x)
    assert out.dtype == np.float16 and out.shape == (2, 5)
    dtype = TensorProto.INT32 if op == "Bernoulli" else TensorProto.DOUBLE
    out = run(op, x, dtype=dtype, seed=1.0)
    assert out.dtype == (np.int32 if op == "Bernoulli" else np.float64)
    np.testing.assert_array_equal(to_numpy(out), to_numpy(run(op, x, dtype=dtype, seed=1.0)))


def test_random_uses_the_context_generator_without_a_seed():
    a = run("RandomUniform", shape=[4], rng=np.random.default_rng(7))
    b = run("RandomUniform", shape=[4], rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


def test_bernoulli_extremes():
    p = np.array([0.0, 1.0, 0.0, 1.0])
    assert run("Bernoulli", p, seed=0.0).tolist() == [0, 1, 0, 1]


def test_multinomial_shapes_and_certain_outcomes(xp):
    logits = np.log(np.array([[1e-9, 1.0, 1e-9], [1.0, 1e-9, 1e-9]], np.float32))
    out = run("Multinomial", xp.asarray(logits), sample_size=5, seed=2.0)
    assert out.dtype == np.int32 and out.shape == (2, 5)
    assert to_numpy(out).tolist() == [[1] * 5, [0] * 5]
    out = run("Multinomial", xp.asarray(logits), dtype=TensorProto.INT64)
    assert out.dtype == np.int64 and out.shape == (2, 1)
    with pytest.raises(InputError, match="int32 or int64"):
        run("Multinomial", logits, dtype=TensorProto.FLOAT)


def test_multinomial_frequencies_follow_the_softmax():
    p = np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])
    logits = np.log(np.maximum(p, 1e-30))
    out = run("Multinomial", logits, sample_size=20000, seed=1.0)
    freq = np.stack([np.bincount(row, minlength=3) / 20000 for row in out])
    np.testing.assert_allclose(freq, p, atol=0.02)
