"""Reduction kernels: Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK (numpy expectations)."""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest

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


def run(op, *inputs, opset=21, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext("n", op, opset, n_outputs)
    return entry.fn(*inputs, **kw)


REDUCE = {
    "ReduceSum": lambda x, ax, kd: np.sum(x, axis=ax, keepdims=kd),
    "ReduceMean": lambda x, ax, kd: np.mean(x, axis=ax, keepdims=kd),
    "ReduceMax": lambda x, ax, kd: np.max(x, axis=ax, keepdims=kd),
    "ReduceMin": lambda x, ax, kd: np.min(x, axis=ax, keepdims=kd),
    "ReduceProd": lambda x, ax, kd: np.prod(x, axis=ax, keepdims=kd),
    "ReduceL1": lambda x, ax, kd: np.sum(np.abs(x), axis=ax, keepdims=kd),
    "ReduceL2": lambda x, ax, kd: np.sqrt(np.sum(x * x, axis=ax, keepdims=kd)),
    "ReduceLogSum": lambda x, ax, kd: np.log(np.sum(x, axis=ax, keepdims=kd)),
    "ReduceLogSumExp": lambda x, ax, kd: np.log(np.sum(np.exp(x), axis=ax, keepdims=kd)),
    "ReduceSumSquare": lambda x, ax, kd: np.sum(x * x, axis=ax, keepdims=kd),
}
MY_OPS = list(REDUCE) + ["ArgMax", "ArgMin", "CumSum", "CumProd", "TopK"]


def _data(shape=(3, 4, 5), seed=0):
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(np.float32)


@pytest.mark.parametrize("op", MY_OPS)
def test_every_opset_from_7_has_a_kernel(op):
    versions = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                       if s.name == op and s.domain == ""})
    for opset in range(max(7, versions[0]), 29):
        assert lookup(op, "", opset) is not None


@pytest.mark.parametrize("op", list(REDUCE))
@pytest.mark.parametrize("axes", [None, [1], [-1, 0], [0, 1, 2]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_input_matches_numpy(xp, op, axes, keepdims):
    x = _data()
    ax_in = None if axes is None else xp.asarray(np.array(axes, dtype=np.int64))
    got = run(op, xp.asarray(x), ax_in, keepdims=keepdims)
    want = REDUCE[op](x.astype(np.float64), None if axes is None else tuple(axes),
                      bool(keepdims))
    assert got.dtype == np.float32
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-5)


@pytest.mark.parametrize("op", list(REDUCE))
def test_reduce_axes_attribute_before_the_input_version(op):
    x = _data()
    got = run(op, x, opset=11, axes=[-2], keepdims=0)
    np.testing.assert_allclose(got, REDUCE[op](x.astype(np.float64), (1,), False), rtol=1e-5)


@pytest.mark.parametrize("op", list(REDUCE))
def test_noop_with_empty_axes_keeps_only_the_elementwise_steps(op):
    x = _data((2, 3))
    got = run(op, x, np.array([], dtype=np.int64), noop_with_empty_axes=1)
    want = REDUCE[op](x.astype(np.float64), (), True)  # numpy's axis=()
    assert got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("op", list(REDUCE))
def test_empty_axes_without_noop_reduces_everything(op):
    x = _data((2, 3))
    got = run(op, x, np.array([], dtype=np.int64), keepdims=0)
    assert got.shape == ()


@pytest.mark.parametrize("op, value", [
    ("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf), ("ReduceMin", np.inf),
    ("ReduceL1", 0.0), ("ReduceL2", 0.0), ("ReduceSumSquare", 0.0),
    ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf),
])
def test_reduction_over_an_empty_set_gives_the_identity(op, value):
    x = np.zeros((2, 0, 4), np.float32)
    got = run(op, x, np.array([1], dtype=np.int64))
    assert got.shape == (2, 1, 4) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.full((2, 1, 4), value, np.float32))


def test_empty_set_extremes_for_ints_and_bools():
    x = np.zeros((2, 0), np.int32)
    ax = np.array([1], dtype=np.int64)
    np.testing.assert_array_equal(run("ReduceMax", x, ax, keepdims=0), [-2**31, -2**31])
    np.testing.assert_array_equal(run("ReduceMin", x, ax, keepdims=0), [2**31 - 1] * 2)
    b = np.zeros((2, 0), bool)
    assert run("ReduceMax", b, ax, keepdims=0).tolist() == [False, False]
    assert run("ReduceMin", b, ax, keepdims=0).tolist() == [True, True]


def test_non_reduced_zero_axis_keeps_an_empty_result():
    x = np.zeros((2, 0, 4), np.float32)
    assert run("ReduceSum", x, np.array([2], dtype=np.int64)).shape == (2, 0, 1)


def test_reduce_max_min_on_bool_inputs():
    x = np.array([[True, False], [False, False]])
    ax = np.array([1], dtype=np.int64)
    np.testing.assert_array_equal(run("ReduceMax", x, ax, keepdims=0), [True, False])
    np.testing.assert_array_equal(run("ReduceMin", x, ax, keepdims=0), [False, False])


def test_log_sum_exp_is_stable_for_large_values():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0]], np.float32)
    got = run("ReduceLogSumExp", x, np.array([1], dtype=np.int64), keepdims=0)
    np.testing.assert_allclose(got, [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-6)
    inf = np.array([-np.inf, -np.inf], np.float32)
    assert run("ReduceLogSumExp", inf, keepdims=0) == -np.inf


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64,
                                   np.float16, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op", list(REDUCE))
def test_reductions_keep_the_input_dtype(op, dtype):
    x = (np.arange(12).reshape(3, 4) % 4 + 1).astype(dtype)
    got = run(op, x, np.array([1], dtype=np.int64))
    assert got.dtype == np.dtype(dtype) and got.shape == (3, 1)


def test_float16_sums_accumulate_in_float32():
    x = np.ones(10000, np.float16)
    assert run("ReduceSum", x, keepdims=0) == 10000
    assert run("ReduceMean", x, keepdims=0) == 1


def test_integer_mean_and_sum_stay_integer():
    x = np.array([[1, 2], [3, 5]], np.int32)
    assert run("ReduceMean", x, np.array([1], dtype=np.int64), keepdims=0).tolist() == [1, 4]
    assert run("ReduceSum", x, keepdims=0).dtype == np.int32


def test_axes_out_of_range_raise_shape_error():
    with pytest.raises(ShapeError, match="ReduceSum.*rank 2"):
        run("ReduceSum", np.ones((2, 3)), np.array([2], dtype=np.int64))


# ArgMax / ArgMin ---------------------------------------------------------------------------------

@pytest.mark.parametrize("op, fn", [("ArgMax", np.argmax), ("ArgMin", np.argmin)])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_extremes_match_numpy(xp, op, fn, axis, keepdims):
    x = np.random.default_rng(1).integers(0, 3, (3, 4, 5)).astype(np.float32)
    got = run(op, xp.asarray(x), axis=axis, keepdims=keepdims)
    want = fn(x, axis=axis)
    if keepdims:
        want = np.expand_dims(want, axis)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(to_numpy(got), want)


def test_select_last_index_picks_the_last_tie():
    x = np.array([[2, 2, 1], [0, 3, 3]], np.int32)
    assert run("ArgMax", x, axis=1, keepdims=0, select_last_index=1).tolist() == [1, 2]
    assert run("ArgMax", x, axis=1, keepdims=0).tolist() == [0, 1]
    assert run("ArgMin", x, axis=0, keepdims=0, select_last_index=1).tolist() == [1, 0, 0]


def test_argmax_over_an_empty_axis_raises():
    with pytest.raises(ShapeError, match="size 0"):
        run("ArgMax", np.zeros((2, 0)), axis=1)


# CumSum / CumProd --------------------------------------------------------------------------------

def _cum_expected(x, axis, exclusive, reverse, fn, init):
    y = np.flip(x, axis) if reverse else x
    out = fn(y, axis=axis)
    if exclusive:
        pad = np.full_like(np.take(out, [0], axis=axis), init)
        out = np.concatenate([pad, np.delete(out, -1, axis=axis)], axis=axis)
    return np.flip(out, axis) if reverse else out


@pytest.mark.parametrize("op, fn, init", [("CumSum", np.cumsum, 0), ("CumProd", np.cumprod, 1)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumulative_ops(xp, op, fn, init, exclusive, reverse, axis):
    x = np.arange(1, 13, dtype=np.float64).reshape(3, 4)
    got = run(op, xp.asarray(x), xp.asarray(np.array(axis, np.int32)), exclusive=exclusive,
              reverse=reverse, opset=26)
    np.testing.assert_allclose(to_numpy(got), _cum_expected(x, axis, exclusive, reverse, fn,
                                                            init))


def test_cumsum_spec_example_and_dtype():
    x = np.array([1, 2, 3], np.int8)
    ax = np.array([0], dtype=np.int64)
    assert run("CumSum", x, ax).tolist() == [1, 3, 6]
    assert run("CumSum", x, ax, exclusive=1).tolist() == [0, 1, 3]
    assert run("CumSum", x, ax, reverse=1).tolist() == [6, 5, 3]
    assert run("CumSum", x, ax, exclusive=1, reverse=1).tolist() == [5, 3, 0]
    assert run("CumSum", x, ax).dtype == np.int8
    assert run("CumSum", np.zeros((2, 0)), ax, exclusive=1).shape == (2, 0)


# TopK --------------------------------------------------------------------------------------------

def test_topk_ties_keep_the_lower_index_first(xp):
    x = xp.asarray(np.array([[3, 1, 3, 2, 1, 3]], np.int64))
    v, i = run("TopK", x, xp.asarray(np.array([4], np.int64)), n_outputs=2)
    assert to_numpy(v).tolist() == [[3, 3, 3, 2]] and to_numpy(i).tolist() == [[0, 2, 5, 3]]
    v, i = run("TopK", x, xp.asarray(np.array([3], np.int64)), largest=0, n_outputs=2)
    assert to_numpy(v).tolist() == [[1, 1, 2]] and to_numpy(i).tolist() == [[1, 4, 3]]


@pytest.mark.parametrize("dtype", [np.float32, np.uint64, np.int8, ml_dtypes.bfloat16])
def test_topk_along_an_axis_matches_sorting(dtype):
    x = np.random.default_rng(2).permutation(60).reshape(3, 20).T.astype(dtype)
    v, i = run("TopK", x, np.array([5], np.int64), axis=0, n_outputs=2)
    want = np.sort(x.astype(np.float64), axis=0)[::-1][:5]
    assert v.dtype == np.dtype(dtype) and i.dtype == np.int64 and v.shape == (5, 3)
    np.testing.assert_array_equal(v.astype(np.float64), want)
    np.testing.assert_array_equal(np.take_along_axis(x, i, axis=0), v)


def test_topk_k_attribute_before_opset_10():
    x = np.array([1.0, 5.0, 3.0], np.float32)
    v, i = run("TopK", x, opset=9, k=2, n_outputs=2)
    assert v.tolist() == [5.0, 3.0] and i.tolist() == [1, 2]


def test_topk_k_larger_than_axis_raises():
    with pytest.raises(ShapeError, match="k=4"):
        run("TopK", np.ones(3, np.float32), np.array([4], np.int64))
    with pytest.raises(InputError, match="exactly one"):
        run("TopK", np.ones(3, np.float32), np.array([1, 2], np.int64))


@pytest.mark.parametrize("op", list(REDUCE))
def test_strided_views_reduce_like_their_contiguous_copy(op):
    """A transposed view (the layout pass' NHWC -> NCHW) is reduced in memory order (axes
    merged): same result as its contiguous copy, for every axes / keepdims / size-1 axis case,
    including ones where the kept axes are out of memory order (the plain path)."""
    base = _data((2, 3, 1, 4, 5), seed=3)
    views = (base.transpose(0, 4, 1, 2, 3), base.transpose(3, 0, 2, 4, 1), base[:, :, :, ::2])
    for v in views:
        assert not v.flags.c_contiguous
        for axes in ([2, 3], [1, 4], [0], [0, 2, 3, 4], [-1]):
            for keepdims in (0, 1):
                got = run(op, v, np.array(axes, np.int64), keepdims=keepdims)
                want = run(op, np.ascontiguousarray(v), np.array(axes, np.int64),
                           keepdims=keepdims)
                assert got.shape == want.shape and got.dtype == want.dtype
                np.testing.assert_allclose(got, want, rtol=1e-6)
