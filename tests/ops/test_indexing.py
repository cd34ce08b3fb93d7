"""Indexing kernels: Gather*, Scatter*, TensorScatter, Compress, NonZero, OneHot, Unique."""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest

import workbench.ops.indexing as indexing
from workbench.arrays import cupy_module, to_numpy
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

I64 = np.int64


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """The array module the kernels run on (cupy only where it is installed)."""
    if request.param == "numpy":
        return np
    cp = cupy_module()
    if cp is None:
        pytest.skip("cupy is not installed")
    return cp


class _OtherModule:
    """numpy under another identity: drives the code paths taken for non-numpy modules.
    Like cupy, its argsort is always stable and takes no ``kind``."""

    @staticmethod
    def argsort(a, axis=-1):
        return np.argsort(a, axis=axis, kind="stable")

    def __getattr__(self, name):
        return getattr(np, name)


def run(op, *inputs, opset=21, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext("n", op, opset, n_outputs)
    return entry.fn(*inputs, **kw)


def ints(*values):
    return np.array(values, dtype=I64)


MY_OPS = ["Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND",
          "TensorScatter", "Compress", "NonZero", "OneHot", "Unique"]


@pytest.mark.parametrize("op", MY_OPS)
def test_every_opset_from_7_has_a_kernel(op):
    versions = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                       if s.name == op and s.domain == ""})
    for opset in range(max(7, versions[0]), 29):
        assert lookup(op, "", opset) is not None


# Gather family -----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(xp, axis):
    x = np.arange(24).reshape(2, 3, 4)
    idx = np.array([[0, -1], [1, 1]], dtype=np.int32)
    got = run("Gather", xp.asarray(x), xp.asarray(idx), axis=axis)
    np.testing.assert_array_equal(to_numpy(got), np.take(x, idx % x.shape[axis], axis=axis))


def test_gather_scalar_index_and_bounds():
    x = np.arange(6).reshape(2, 3)
    assert run("Gather", x, np.array(1, I64), axis=1).tolist() == [1, 4]
    with pytest.raises(InputError, match="index 3 is out of bounds for axis 1 of size 3"):
        run("Gather", x, ints(3), axis=1)
    assert run("Gather", x, np.zeros((0,), I64)).shape == (0, 3)


def test_gather_elements_spec_examples(xp):
    data = xp.asarray(np.array([[1, 2], [3, 4]]))
    got = run("GatherElements", data, xp.asarray(np.array([[0, 0], [1, 0]])), axis=1)
    assert to_numpy(got).tolist() == [[1, 1], [4, 3]]
    data = np.arange(1, 10).reshape(3, 3)
    got = run("GatherElements", data, np.array([[1, -1, 0], [2, 0, 0]]), axis=0)
    assert got.tolist() == [[4, 8, 3], [7, 2, 3]]


def test_gather_elements_smaller_indices_than_data():
    data = np.arange(12).reshape(3, 4)
    got = run("GatherElements", data, np.array([[3], [0]]), axis=1)
    assert got.tolist() == [[3], [4]]


@pytest.mark.parametrize("batch_dims, data, indices, want", [
    (0, [[0, 1], [2, 3]], [[0, 0], [1, 1]], [0, 3]),
    (0, [[0, 1], [2, 3]], [[1], [0]], [[2, 3], [0, 1]]),
    (0, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[0, 1], [1, 0]], [[2, 3], [4, 5]]),
    (0, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[[0, 1]], [[1, 0]]], [[[2, 3]], [[4, 5]]]),
    (1, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[1], [0]], [[2, 3], [4, 5]]),
    (1, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[[1, -1]], [[0, 0]]], [[3], [4]]),
])
def test_gather_nd_spec_examples(xp, batch_dims, data, indices, want):
    got = run("GatherND", xp.asarray(np.array(data)), xp.asarray(np.array(indices, I64)),
              batch_dims=batch_dims)
    assert to_numpy(got).tolist() == want


def test_gather_nd_errors():
    with pytest.raises(ShapeError, match="indices.shape"):
        run("GatherND", np.zeros((2, 2)), np.zeros((1, 3), I64))
    with pytest.raises(InputError, match="out of bounds"):
        run("GatherND", np.zeros((2, 2)), ints(0, 2))


# Scatter family ----------------------------------------------------------------------------------

def _scatter_elements_loop(data, indices, updates, axis, reduction):
    out = data.copy()
    f = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
         "min": np.minimum}[reduction]
    for pos in np.ndindex(indices.shape):
        tgt = list(pos)
        tgt[axis] = indices[pos] % data.shape[axis]
        out[tuple(tgt)] = f(out[tuple(tgt)], updates[pos])
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements_reductions_with_duplicates(xp, reduction, axis):
    rng = np.random.default_rng(3)
    data = rng.uniform(-1, 1, (4, 5))
    ax = axis % 2
    dim = data.shape[ax]
    if reduction == "none":  # no duplicates along the axis
        shape = (3, 5) if ax == 0 else (4, 3)
        perms = [rng.permutation(dim)[:shape[ax]] for _ in range(shape[1 - ax])]
        indices = np.stack(perms, axis=1 - ax)
    else:
        shape = (6, 5) if ax == 0 else (4, 7)
        indices = rng.integers(-dim, dim, shape)
    updates = rng.uniform(-1, 1, shape)
    got = run("ScatterElements", xp.asarray(data), xp.asarray(indices), xp.asarray(updates),
              axis=axis, reduction=reduction)
    np.testing.assert_allclose(to_numpy(got),
                               _scatter_elements_loop(data, indices, updates, axis, reduction))


def test_scatter_elements_spec_example_and_deprecated_scatter():
    data = np.zeros((3, 3), np.float32)
    indices = np.array([[1, 0, 2], [0, 2, 1]])
    updates = np.array([[1.0, 1.1, 1.2], [2.0, 2.1, 2.2]], np.float32)
    want = [[2.0, 1.1, 0.0], [1.0, 0.0, 2.2], [0.0, 2.1, 1.2]]
    np.testing.assert_allclose(run("ScatterElements", data, indices, updates), want)
    np.testing.assert_allclose(run("Scatter", data, indices, updates, opset=9), want)
    assert data.sum() == 0  # the input is not written


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_reductions(xp, reduction):
    data = np.arange(1, 9, dtype=np.float64)
    if reduction == "none":
        indices, updates = np.array([[4], [3], [1], [7]]), np.array([9.0, 10, 11, 12])
    else:
        indices, updates = np.array([[4], [-5], [1], [4]]), np.array([9.0, 10, 11, 12])
    got = run("ScatterND", xp.asarray(data), xp.asarray(indices), xp.asarray(updates),
              reduction=reduction)
    want = data.copy()
    f = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
         "min": np.minimum}[reduction]
    for i, u in zip(indices[:, 0], updates):
        want[i] = f(want[i], u)
    np.testing.assert_allclose(to_numpy(got), want)


def test_scatter_nd_slices():
    data = np.zeros((4, 2, 3))
    indices = np.array([[0], [2]])
    updates = np.ones((2, 2, 3))
    got = run("ScatterND", data, indices, updates)
    assert got.sum(axis=(1, 2)).tolist() == [6, 0, 6, 0]
    with pytest.raises(ShapeError, match="updates shape"):
        run("ScatterND", data, indices, np.ones((2, 3)))


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min", "none"])
def test_scatter_rounds_path_for_other_array_modules(monkeypatch, reduction):
    """Without ``ufunc.at`` (cupy) duplicates are applied in rounds, in index order."""
    monkeypatch.setattr(indexing, "xp_of", lambda *a: _OtherModule())
    data = np.array([1.0, 2.0, 3.0])
    indices = np.array([[0], [2], [0], [0]])
    updates = np.array([2.0, 5.0, 3.0, 0.5])
    got = run("ScatterND", data, indices, updates, reduction=reduction)
    f = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
         "min": np.minimum}[reduction]
    want = data.copy()
    for i, u in zip(indices[:, 0], updates):
        want[i] = f(want[i], u)
    np.testing.assert_allclose(got, want)


def test_tensor_scatter_linear_and_circular(xp):
    past = np.zeros((2, 3, 5, 2), np.float32)
    update = np.ones((2, 3, 2, 2), np.float32)
    got = run("TensorScatter", xp.asarray(past), xp.asarray(update),
              xp.asarray(ints(1, 3)), opset=24)
    got = to_numpy(got)
    assert got[0, :, 1:3].all() and got[0, :, [0, 3, 4]].sum() == 0
    assert got[1, :, 3:5].all() and got[1, :, :3].sum() == 0
    got = to_numpy(run("TensorScatter", xp.asarray(past), xp.asarray(update),
                       xp.asarray(ints(4, 0)), mode="circular", opset=24))
    assert got[0, :, [4, 0]].all() and got[0, :, 1:4].sum() == 0
    with pytest.raises(InputError, match="linear"):
        run("TensorScatter", past, update, ints(4, 0), opset=24)


def test_tensor_scatter_default_write_indices_and_axis():
    past = np.zeros((1, 4, 3))
    got = run("TensorScatter", past, np.ones((1, 2, 3)), axis=1, opset=24)
    assert got[0, :2].all() and got[0, 2:].sum() == 0


# Selection ---------------------------------------------------------------------------------------

def test_compress(xp):
    x = xp.asarray(np.arange(6).reshape(3, 2))
    cond = xp.asarray(np.array([False, True, True]))
    assert to_numpy(run("Compress", x, cond, axis=0)).tolist() == [[2, 3], [4, 5]]
    assert to_numpy(run("Compress", x, xp.asarray(np.array([0, 1], bool)), axis=-1)).tolist() \
        == [[1], [3], [5]]
    assert to_numpy(run("Compress", x, cond)).tolist() == [1, 2]


def test_non_zero(xp):
    x = np.array([[1, 0], [1, 1]])
    got = run("NonZero", xp.asarray(x))
    assert got.dtype == np.int64 and to_numpy(got).tolist() == [[0, 1, 1], [0, 0, 1]]
    assert run("NonZero", np.array(5)).shape == (0, 1)
    assert run("NonZero", np.zeros((2, 3))).shape == (2, 0)


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_one_hot(xp, axis):
    indices = np.array([[0, -1], [5, 2]], np.float32)
    got = to_numpy(run("OneHot", xp.asarray(indices), xp.asarray(np.array(3.0)),
                       xp.asarray(np.array([1, 7], np.int64)), axis=axis))
    assert got.dtype == np.int64
    want = np.ones((2, 2, 3), np.int64)
    want[0, 0, 0] = want[0, 1, 2] = want[1, 1, 2] = 7  # 5 is out of range: all off
    np.testing.assert_array_equal(got, np.moveaxis(want, -1, axis))


# Unique ------------------------------------------------------------------------------------------

def _unique(x, n_outputs=4, **attrs):
    return run("Unique", x, n_outputs=n_outputs, **attrs)


def test_unique_spec_examples(xp):
    y, idx, inv, cnt = (to_numpy(a) for a in _unique(xp.asarray(np.array([2, 1, 1, 3, 4, 3])),
                                                       sorted=0))
    assert (y.tolist(), idx.tolist(), inv.tolist(), cnt.tolist()) == (
        [2, 1, 3, 4], [0, 1, 3, 4], [0, 1, 1, 2, 3, 2], [1, 2, 2, 1])
    y, idx, inv, cnt = (to_numpy(a) for a in _unique(xp.asarray(np.array([[1, 3], [2, 3]]))))
    assert (y.tolist(), idx.tolist(), inv.tolist(), cnt.tolist()) == (
        [1, 2, 3], [0, 2, 1], [0, 2, 1, 2], [1, 1, 2])
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]])
    y, idx, inv, cnt = (to_numpy(a) for a in _unique(xp.asarray(x), axis=0))
    assert y.tolist() == [[1, 0, 0], [2, 3, 4]] and idx.tolist() == [0, 2]
    assert inv.tolist() == [0, 0, 1] and cnt.tolist() == [2, 1]


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_matches_numpy(axis, sorted_):
    x = np.random.default_rng(4).integers(0, 2, (4, 3, 2)).astype(np.float32)
    y, idx, inv, cnt = _unique(x, axis=axis, sorted=sorted_)
    ny, nidx, ninv, ncnt = np.unique(x, return_index=True, return_inverse=True,
                                     return_counts=True, axis=axis)
    order = np.argsort(nidx, kind="stable") if not sorted_ else np.arange(len(nidx))
    ax = 0 if axis is None else axis
    np.testing.assert_array_equal(y, np.take(ny, order, axis=ax))
    np.testing.assert_array_equal(idx, nidx[order])
    np.testing.assert_array_equal(cnt, ncnt[order])
    np.testing.assert_array_equal(np.take(y, inv, axis=ax), x.reshape(-1) if axis is None
                                  else x)


def test_unique_row_sort_for_other_array_modules():
    rows = np.array([[1, 2], [0, 5], [1, 1], [0, 5]])
    order = indexing._sort_rows(_OtherModule(), rows)
    assert order.tolist() == [1, 3, 2, 0]


def test_unique_optional_outputs_and_empty():
    assert len(_unique(np.array([1, 1]), n_outputs=1)) == 1
    y, idx, inv, cnt = _unique(np.zeros((0,), np.float32))
    assert y.shape == idx.shape == inv.shape == cnt.shape == (0,)
