"""Shape kernels: Reshape, Transpose, Flatten, (Un)Squeeze, Concat, Split, Slice, Pad, Expand,
Tile, Shape, Size, DepthToSpace, SpaceToDepth, CenterCropPad, Trilu, ReverseSequence."""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest

from workbench.arrays import cupy_module, to_numpy
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

I64 = np.int64
INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min


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


def ints(*values):
    return np.array(values, dtype=I64)


MY_OPS = ["Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
          "Pad", "Expand", "Tile", "Shape", "Size", "DepthToSpace", "SpaceToDepth",
          "CenterCropPad", "Trilu", "ReverseSequence"]


@pytest.mark.parametrize("op", MY_OPS)
def test_every_opset_from_7_has_a_kernel(op):
    versions = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                       if s.name == op and s.domain == ""})
    for opset in range(max(7, versions[0]), 29):
        assert lookup(op, "", opset) is not None


# Reshape / Transpose / Flatten -------------------------------------------------------------------

def test_reshape_zero_copies_and_minus_one_infers(xp):
    x = xp.arange(24).reshape(2, 3, 4)
    out = run("Reshape", x, ints(0, -1))
    assert out.shape == (2, 12)
    assert run("Reshape", x, ints(4, 0, -1)).shape == (4, 3, 2)
    assert run("Reshape", x, ints(-1)).shape == (24,)


def test_reshape_returns_a_view():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert np.shares_memory(run("Reshape", x, ints(6, 4)), x)


def test_reshape_to_scalar_and_allowzero():
    assert run("Reshape", np.array([7.0]), ints()).shape == ()
    empty = np.zeros((0, 3))
    assert run("Reshape", empty, ints(0, 3), allowzero=1).shape == (0, 3)
    assert run("Reshape", empty, ints(3, 0), allowzero=1).shape == (3, 0)
    with pytest.raises(ShapeError, match="both 0 and -1"):
        run("Reshape", empty, ints(0, -1), allowzero=1)


def test_reshape_attribute_form_before_opset_5():
    assert run("Reshape", np.arange(6), opset=1, shape=[3, -1]).shape == (3, 2)


def test_reshape_errors_name_the_shapes():
    with pytest.raises(ShapeError, match=r"\(2, 3\)"):
        run("Reshape", np.zeros((2, 3)), ints(4, 2))
    with pytest.raises(ShapeError, match="more than one -1"):
        run("Reshape", np.zeros((2, 3)), ints(-1, -1))


def test_transpose_default_reverses_and_perm(xp):
    x = xp.asarray(np.arange(24).reshape(2, 3, 4))
    assert run("Transpose", x).shape == (4, 3, 2)
    out = run("Transpose", x, perm=[1, 0, 2])
    np.testing.assert_array_equal(to_numpy(out), np.arange(24).reshape(2, 3, 4).transpose(1, 0, 2))
    with pytest.raises(ShapeError, match="permutation"):
        run("Transpose", x, perm=[0, 0, 1])


@pytest.mark.parametrize("axis, shape", [(0, (1, 24)), (1, (2, 12)), (-1, (6, 4)), (3, (24, 1)),
                                         (-3, (1, 24))])
def test_flatten_axes(axis, shape):
    assert run("Flatten", np.zeros((2, 3, 4)), axis=axis).shape == shape


def test_flatten_with_zero_dims():
    assert run("Flatten", np.zeros((2, 0, 4)), axis=2).shape == (0, 4)
    with pytest.raises(ShapeError, match="axis 4"):
        run("Flatten", np.zeros((2, 3)), axis=4)


# Squeeze / Unsqueeze -----------------------------------------------------------------------------

def test_squeeze_input_and_attribute_forms():
    x = np.zeros((1, 3, 1, 2))
    assert run("Squeeze", x).shape == (3, 2)
    assert run("Squeeze", x, ints(-2)).shape == (1, 3, 2)
    assert run("Squeeze", x, opset=11, axes=[0]).shape == (3, 1, 2)
    with pytest.raises(ShapeError, match="size 3"):
        run("Squeeze", x, ints(1))


def test_unsqueeze_input_and_attribute_forms():
    x = np.zeros((3, 4))
    assert run("Unsqueeze", x, ints(0, -1)).shape == (1, 3, 4, 1)
    assert run("Unsqueeze", x, ints(1, 3)).shape == (3, 1, 4, 1)
    assert run("Unsqueeze", x, opset=11, axes=[0]).shape == (1, 3, 4)
    assert run("Unsqueeze", np.float32(2.0) * np.ones(()), ints(0)).shape == (1,)
    with pytest.raises(ShapeError, match="duplicates"):
        run("Unsqueeze", x, ints(0, -4))


# Concat / Split ----------------------------------------------------------------------------------

def test_concat_negative_axis_and_empty_inputs(xp):
    a = xp.asarray(np.ones((2, 2)))
    b = xp.asarray(np.zeros((2, 3)))
    assert run("Concat", a, b, axis=-1).shape == (2, 5)
    assert run("Concat", a, xp.asarray(np.zeros((2, 0))), axis=1).shape == (2, 2)
    assert run("Concat", a, xp.asarray(np.zeros((0,))), axis=0).shape == (2, 2)
    with pytest.raises(ShapeError, match="do not match"):
        run("Concat", a, b, axis=0)


def test_split_forms_across_opsets():
    x = np.arange(10)
    assert [p.tolist() for p in run("Split", x, n_outputs=2, opset=11)] == [
        list(range(5)), list(range(5, 10))]
    parts = run("Split", x, opset=11, split=[3, 7], n_outputs=2)
    assert [len(p) for p in parts] == [3, 7]
    parts = run("Split", x, ints(2, 0, 8), n_outputs=3, opset=13)
    assert [len(p) for p in parts] == [2, 0, 8]
    parts = run("Split", x, num_outputs=4, n_outputs=4, opset=18)
    assert [len(p) for p in parts] == [3, 3, 3, 1]
    parts = run("Split", np.zeros((2, 7)), axis=-1, num_outputs=3, n_outputs=3, opset=18)
    assert [p.shape for p in parts] == [(2, 3), (2, 3), (2, 1)]
    with pytest.raises(ShapeError, match="add up to 10"):
        run("Split", x, ints(3, 3), n_outputs=2, opset=13)


def test_split_outputs_are_views():
    x = np.arange(10.0)
    assert all(np.shares_memory(p, x) for p in run("Split", x, n_outputs=2, opset=13))


# Slice -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("starts, ends, axes, steps, want", [
    ([1], [3], [0], [1], np.s_[1:3]),
    ([0, 1], [-1, 1000], None, None, np.s_[0:-1, 1:]),
    ([-1], [INT_MIN], [1], [-1], np.s_[:, ::-1]),
    ([3], [0], [1], [-2], np.s_[:, 3:0:-2]),
    ([10], [INT_MAX], [0], [1], np.s_[10:]),
    ([-100], [100], [-1], [3], np.s_[:, ::3]),
    ([0], [-1], [1], [-1], np.s_[:, 0:0]),
    ([4], [-100], [1], [-1], np.s_[:, 4::-1]),
])
def test_slice_matches_python_slicing(xp, starts, ends, axes, steps, want):
    x = np.arange(30).reshape(5, 6)
    args = [ints(*starts), ints(*ends)]
    if axes is not None or steps is not None:
        args.append(ints(*axes) if axes is not None else None)
        args.append(ints(*steps) if steps is not None else None)
    got = run("Slice", xp.asarray(x), *args)
    np.testing.assert_array_equal(to_numpy(got), x[want])


def test_slice_attribute_form_before_opset_10_and_views():
    x = np.arange(30).reshape(5, 6)
    out = run("Slice", x, opset=9, starts=[1, -2], ends=[3, INT_MAX], axes=[0, 1])
    np.testing.assert_array_equal(out, x[1:3, -2:])
    assert np.shares_memory(out, x)
    np.testing.assert_array_equal(run("Slice", x, np.array([2], np.int32),
                                      np.array([4], np.int32)), x[2:4])


def test_slice_zero_step_raises():
    with pytest.raises(ShapeError, match="steps cannot be 0"):
        run("Slice", np.zeros(3), ints(0), ints(2), ints(0), ints(0))


def test_slice_remembers_indices_per_shape_and_values():
    """The remembered index is keyed by the data's shape and every input's dtype, shape and
    values: the same inputs on another shape, int32 vs int64 inputs, changed values and a
    zero step after a valid one each give their own answer."""
    x, y = np.arange(30).reshape(5, 6), np.arange(12).reshape(2, 6)
    for _ in range(2):
        np.testing.assert_array_equal(run("Slice", x, ints(-3), ints(INT_MAX), ints(0)), x[-3:])
        np.testing.assert_array_equal(run("Slice", y, ints(-3), ints(INT_MAX), ints(0)), y[-3:])
        np.testing.assert_array_equal(run("Slice", x, ints(1), ints(4), ints(1), ints(2)),
                                      x[:, 1:4:2])
        np.testing.assert_array_equal(run("Slice", x, np.array([1], np.int32),
                                          np.array([4], np.int32), np.array([1], np.int32)),
                                      x[:, 1:4])
        np.testing.assert_array_equal(run("Slice", x, ints(2), ints(4), ints(1)), x[:, 2:4])
        with pytest.raises(ShapeError, match="steps cannot be 0"):
            run("Slice", x, ints(1), ints(4), ints(1), ints(0))


# Pad ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 2, 1], [0, 5, 3, 0], [4, 0, 0, 7]])
def test_pad_modes_match_numpy(xp, mode, pads):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = run("Pad", xp.asarray(x), xp.asarray(ints(*pads)), mode=mode)
    np_mode = {"edge": "edge", "reflect": "reflect", "wrap": "wrap"}.get(mode, "constant")
    want = np.pad(x, [(pads[0], pads[2]), (pads[1], pads[3])], mode=np_mode)
    np.testing.assert_array_equal(to_numpy(got), want)


def test_pad_constant_value_negative_pads_and_axes():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = run("Pad", x, ints(1, 0, 0, 0), np.array(9, np.int32))
    np.testing.assert_array_equal(got, np.pad(x, [(1, 0), (0, 0)], constant_values=9))
    got = run("Pad", x, ints(-1, 1, 0, -2))
    np.testing.assert_array_equal(got, np.pad(x[1:, :2], [(0, 0), (1, 0)]))
    got = run("Pad", x, ints(2, 1), None, ints(-1))
    np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (2, 1)]))


def test_pad_attribute_forms_before_opset_11():
    x = np.ones((2, 2), np.float32)
    got = run("Pad", x, opset=2, pads=[0, 1, 0, 1], value=5.0)
    np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (1, 1)], constant_values=5))
    got = run("Pad", x, opset=1, paddings=[1, 0, 0, 0])
    assert got.shape == (3, 2)


def test_pad_strings_and_bad_mode():
    x = np.array(["a", "b"], dtype=object)
    assert run("Pad", x, ints(1, 0)).tolist() == ["", "a", "b"]
    with pytest.raises(InputError, match="symmetric"):
        run("Pad", np.ones(2), ints(1, 1), mode="symmetric")
    with pytest.raises(ShapeError, match="size 0"):
        run("Pad", np.ones((0, 2)), ints(1, 0, 0, 0), mode="edge")
    with pytest.raises(ShapeError, match="remove more than"):
        run("Pad", np.ones((3, 2)), ints(-2, 0, -2, 0))


# Expand / Tile / Shape / Size --------------------------------------------------------------------

def test_expand_broadcasts_both_ways(xp):
    x = xp.asarray(np.arange(3.0).reshape(3, 1))
    assert run("Expand", x, ints(2, 1, 6)).shape == (2, 3, 6)
    assert run("Expand", x, ints(1)).shape == (3, 1)
    np.testing.assert_array_equal(to_numpy(run("Expand", x, ints(3, 4)))[:, 3], [0, 1, 2])
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        run("Expand", x, ints(2, 2))


def test_tile_both_forms():
    x = np.array([[1, 2], [3, 4]])
    np.testing.assert_array_equal(run("Tile", x, ints(2, 1)), np.tile(x, (2, 1)))
    np.testing.assert_array_equal(run("Tile", x, ints(3), ints(1), opset=1), np.tile(x, (1, 3)))
    with pytest.raises(ShapeError, match="one value"):
        run("Tile", x, ints(2))


@pytest.mark.parametrize("start, end, want", [
    (0, None, [2, 3, 4]), (-1, None, [4]), (0, -1, [2, 3]), (1, 2, [3]),
    (-10, 10, [2, 3, 4]), (2, 1, []),
])
def test_shape_start_end(start, end, want):
    kw = {"start": start} if end is None else {"start": start, "end": end}
    out = run("Shape", np.zeros((2, 3, 4)), **kw)
    assert out.dtype == np.int64 and out.tolist() == want


def test_size_is_a_0d_int64():
    out = run("Size", np.zeros((2, 0, 4)))
    assert out.shape == () and out.dtype == np.int64 and int(out) == 0


# DepthToSpace / SpaceToDepth ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(xp, mode):
    x = np.arange(2 * 8 * 3 * 2, dtype=np.float32).reshape(2, 8, 3, 2)
    y = run("DepthToSpace", xp.asarray(x), blocksize=2, mode=mode)
    assert y.shape == (2, 2, 6, 4)
    back = run("SpaceToDepth", y, blocksize=2, mode=mode, opset=28)
    np.testing.assert_array_equal(to_numpy(back), x)


def test_depth_to_space_dcr_spec_formula():
    x = np.arange(1 * 8 * 2 * 3).reshape(1, 8, 2, 3)
    b, c, h, w = x.shape
    tmp = x.reshape(b, 2, 2, c // 4, h, w).transpose(0, 3, 4, 1, 5, 2)
    np.testing.assert_array_equal(run("DepthToSpace", x, blocksize=2),
                                  tmp.reshape(b, c // 4, h * 2, w * 2))
    with pytest.raises(ShapeError, match="divisible"):
        run("DepthToSpace", np.zeros((1, 6, 2, 2)), blocksize=2)


# CenterCropPad / Trilu / ReverseSequence ---------------------------------------------------------

def test_center_crop_pad():
    x = np.arange(20).reshape(4, 5)
    np.testing.assert_array_equal(run("CenterCropPad", x, ints(2, 3)), x[1:3, 1:4])
    out = run("CenterCropPad", x, ints(7, 5))
    assert out.shape == (7, 5)
    np.testing.assert_array_equal(out[1:5], x)  # 3 extra rows: 1 before, 2 after
    assert out[0].sum() == 0 and out[5:].sum() == 0
    out = run("CenterCropPad", np.zeros((3, 10, 10)), ints(4, 4), axes=[-2, -1])
    assert out.shape == (3, 4, 4)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-5, -1, 0, 2, 7])
def test_trilu_matches_numpy(xp, upper, k):
    x = np.arange(2 * 4 * 5).reshape(2, 4, 5) + 1
    got = run("Trilu", xp.asarray(x), xp.asarray(np.array(k, I64)), upper=upper)
    want = np.triu(x, k) if upper else np.tril(x, k)
    np.testing.assert_array_equal(to_numpy(got), want)


def test_trilu_default_k_and_rank_check():
    x = np.ones((3, 3), bool)
    np.testing.assert_array_equal(run("Trilu", x), np.triu(x))
    with pytest.raises(ShapeError, match="rank >= 2"):
        run("Trilu", np.ones(3))


def test_reverse_sequence_spec_examples(xp):
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    got = run("ReverseSequence", xp.asarray(x.T.copy()), xp.asarray(ints(4, 3, 2, 1)),
              time_axis=0, batch_axis=1)
    np.testing.assert_array_equal(to_numpy(got), [[3, 6, 9, 12], [2, 5, 8, 13], [1, 4, 10, 14],
                                                  [0, 7, 11, 15]])
    got = run("ReverseSequence", xp.asarray(x), xp.asarray(ints(1, 2, 3, 4)), time_axis=1,
              batch_axis=0)
    np.testing.assert_array_equal(to_numpy(got), [[0, 1, 2, 3], [5, 4, 6, 7], [10, 9, 8, 11],
                                                  [15, 14, 13, 12]])


def test_reverse_sequence_extra_dims():
    x = np.arange(3 * 2 * 2).reshape(3, 2, 2)
    got = run("ReverseSequence", x, ints(3, 1))
    np.testing.assert_array_equal(got[:, 0], x[::-1, 0])
    np.testing.assert_array_equal(got[:, 1], x[:, 1])
