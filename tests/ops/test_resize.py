"""Resize / Upsample / GridSample / AffineGrid kernels against naive per-element loops written
here, with onnx.reference as a second oracle for the modes it defines the same way."""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import pytest
from onnx import helper

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(0)


def run(op, *inputs, opset=19, n_outputs=1, **attrs):
    """Run the registered kernel of ``op`` as the executor would (spec defaults filled in)."""
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


def reference(op, inputs, opset, **attrs):
    """onnx.reference as an oracle for one single-output node (tests only)."""
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    node = helper.make_node(op, names, ["o"], **attrs)
    feeds = {n: v for n, v in zip(names, inputs) if v is not None}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_tensor_value_info("o", onnx.TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


# --------------------------------------------------------------------------------------------
# naive Resize: every output element computed on its own
# --------------------------------------------------------------------------------------------

def _coord(mode, i, in_len, out_len, scale, roi=(0.0, 1.0)):
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if out_len > 1 else 0.0
    if mode == "align_corners":
        return 0.0 if out_len == 1 else i * (in_len - 1) / (out_len - 1)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "tf_crop_and_resize":
        s, e = roi
        if out_len > 1:
            return s * (in_len - 1) + i * (e - s) * (in_len - 1) / (out_len - 1)
        return 0.5 * (s + e) * (in_len - 1)
    raise AssertionError(mode)


def _cubic(d, a):
    d = abs(d)
    if d <= 1:
        return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
    if d < 2:
        return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
    return 0.0


def _taps(mode, x, in_len, a=-0.75, exclude_outside=False, nearest_mode="round_prefer_floor"):
    """[(index, weight)] for one output coordinate along one axis."""
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            k = math.ceil(x - 0.5)
        elif nearest_mode == "round_prefer_ceil":
            k = math.floor(x + 0.5)
        elif nearest_mode == "floor":
            k = math.floor(x)
        else:
            k = math.ceil(x)
        return [(min(max(k, 0), in_len - 1), 1.0)]
    x0 = math.floor(x)
    if mode == "linear":
        taps = [(x0, 1 - (x - x0)), (x0 + 1, x - x0)]
    else:
        taps = [(x0 + o, _cubic(x0 + o - x, a)) for o in (-1, 0, 1, 2)]
    if exclude_outside:
        taps = [(k, w if 0 <= k < in_len else 0.0) for k, w in taps]
        total = sum(w for _, w in taps)
        taps = [(k, w / total) for k, w in taps]
    return [(min(max(k, 0), in_len - 1), w) for k, w in taps]


def naive_resize(x, out_shape, scales, mode, coord, **kw):
    roi = kw.pop("roi", None)
    extrap = kw.pop("extrapolation_value", 0.0)
    y = np.zeros(out_shape)
    for o in itertools.product(*[range(n) for n in out_shape]):
        per_axis = []
        outside = False
        for ax, i in enumerate(o):
            r = roi[ax] if roi else (0.0, 1.0)
            c = _coord(coord, i, x.shape[ax], out_shape[ax], scales[ax], r)
            if coord == "tf_crop_and_resize" and not 0 <= c <= x.shape[ax] - 1:
                outside = True
            if out_shape[ax] == x.shape[ax] and scales[ax] == 1 and coord != "tf_crop_and_resize":
                per_axis.append([(i, 1.0)])
            else:
                per_axis.append(_taps(mode, c, x.shape[ax], **kw))
        if outside:
            y[o] = extrap
            continue
        y[o] = sum(np.prod([w for _, w in combo]) * x[tuple(k for k, _ in combo)]
                   for combo in itertools.product(*per_axis))
    return y


COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_half_pixel_for_nn"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("sizes", [(1, 2, 7, 3), (1, 2, 2, 9)])
def test_resize_sizes_against_naive(mode, coord, sizes):
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    y = run("Resize", x, None, None, np.array(sizes, np.int64), mode=mode,
            coordinate_transformation_mode=coord)
    scales = [o / i for o, i in zip(sizes, x.shape)]
    exp = naive_resize(x.astype(np.float64), sizes, scales, mode, coord)
    assert y.shape == sizes and y.dtype == np.float32
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
def test_resize_nearest_modes(nearest_mode):
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    sizes = np.array([1, 1, 8, 8], np.int64)
    y = run("Resize", x, None, None, sizes, mode="nearest", nearest_mode=nearest_mode,
            coordinate_transformation_mode="half_pixel")
    exp = naive_resize(x, (1, 1, 8, 8), [1, 1, 2, 2], "nearest", "half_pixel",
                       nearest_mode=nearest_mode)
    np.testing.assert_array_equal(y, exp)
    np.testing.assert_array_equal(
        y, reference("Resize", [x, None, None, sizes], 19, mode="nearest",
                     nearest_mode=nearest_mode))


def test_resize_cubic_exclude_outside_and_coeff():
    x = RNG.standard_normal((1, 1, 5, 6)).astype(np.float32)
    scales = np.array([1, 1, 0.6, 1.7], np.float32)
    y = run("Resize", x, None, scales, mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)
    out = [1, 1, 3, 10]
    exp = naive_resize(x.astype(np.float64), out, [float(s) for s in scales], "cubic",
                       "half_pixel", a=-0.5, exclude_outside=True)
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-5)


def test_resize_tf_crop_and_resize_extrapolation():
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4], np.float32)
    sizes = np.array([1, 1, 3, 5], np.int64)
    y = run("Resize", x, roi, None, sizes, mode="linear",
            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=9.0)
    rois = [(float(roi[i]), float(roi[i + 4])) for i in range(4)]
    exp = naive_resize(x.astype(np.float64), (1, 1, 3, 5), [1, 1, 0.75, 1.25], "linear",
                       "tf_crop_and_resize", roi=rois, extrapolation_value=9.0)
    np.testing.assert_allclose(y, exp, rtol=1e-5, atol=1e-5)
    assert (y == 9.0).any()


def test_resize_axes_subset_and_negative():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    full = run("Resize", x, None, np.array([1, 1, 2, 0.5], np.float32), mode="linear")
    sub = run("Resize", x, None, np.array([0.5, 2], np.float32), mode="linear", axes=[-1, 2])
    np.testing.assert_allclose(sub, full)
    assert full.shape == (2, 3, 8, 2)


@pytest.mark.parametrize("policy,expected", [("stretch", (1, 1, 6, 9)),
                                             ("not_larger", (1, 1, 6, 8)),
                                             ("not_smaller", (1, 1, 7, 9))])
def test_resize_keep_aspect_ratio_policy(policy, expected):
    x = RNG.standard_normal((1, 1, 3, 4)).astype(np.float32)
    y = run("Resize", x, None, None, np.array([6, 9], np.int64), axes=[2, 3],
            keep_aspect_ratio_policy=policy)
    assert y.shape == expected
    ref = reference("Resize", [x, None, None, np.array([6, 9], np.int64)], 19, axes=[2, 3],
                    keep_aspect_ratio_policy=policy)
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_matches_reference(mode):
    x = RNG.standard_normal((1, 2, 9, 11)).astype(np.float32)
    scales = np.array([1, 1, 0.4, 0.6], np.float32)
    y = run("Resize", x, None, scales, mode=mode, antialias=1)
    ref = reference("Resize", [x, None, scales], 19, mode=mode, antialias=1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # antialias only changes down-sampling
    up = np.array([1, 1, 2, 1.5], np.float32)
    np.testing.assert_allclose(run("Resize", x, None, up, mode=mode, antialias=1),
                               run("Resize", x, None, up, mode=mode), rtol=1e-6)


def test_resize_half_pixel_symmetric_matches_reference():
    x = RNG.standard_normal((1, 1, 4, 5)).astype(np.float32)
    for scales in ([1, 1, 0.6, 2.3], [1, 1, 1.7, 0.8]):
        s = np.array(scales, np.float32)
        y = run("Resize", x, None, s, mode="linear",
                coordinate_transformation_mode="half_pixel_symmetric")
        ref = reference("Resize", [x, None, s], 19, mode="linear",
                        coordinate_transformation_mode="half_pixel_symmetric")
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_resize_output_size_uses_float32_product():
    x = np.zeros((1, 10), np.float32)
    assert run("Resize", x, None, np.array([1, 0.7], np.float32)).shape == (1, 7)


def test_resize_dtypes():
    x8 = np.array([[0, 255, 10]], np.uint8)
    y = run("Resize", x8, None, np.array([1, 2], np.float32), mode="linear")
    assert y.dtype == np.uint8
    exp = naive_resize(x8.astype(np.float64), (1, 6), [1, 2], "linear", "half_pixel")
    np.testing.assert_array_equal(y, np.clip(np.rint(exp), 0, 255))
    h = RNG.standard_normal((1, 1, 3, 3)).astype(np.float16)
    assert run("Resize", h, None, np.array([1, 1, 2, 2], np.float32), mode="cubic").dtype \
        == np.float16
    b = np.array([[True, False]])
    np.testing.assert_array_equal(run("Resize", b, None, np.array([1, 2], np.float32)),
                                  [[True, True, False, False]])
    s = np.array([["a", "b"]], dtype=object)
    assert run("Resize", s, None, np.array([1, 2], np.float32)).tolist() == [["a", "a", "b",
                                                                               "b"]]
    with pytest.raises(InputError, match="numeric"):
        run("Resize", s, None, np.array([1, 2], np.float32), mode="linear")


def test_resize_empty():
    x = np.zeros((0, 3, 4, 4), np.float32)
    y = run("Resize", x, None, np.array([1, 1, 2, 2], np.float32), mode="linear")
    assert y.shape == (0, 3, 8, 8)
    y = run("Resize", np.ones((1, 4), np.float32), None, None, np.array([1, 0], np.int64))
    assert y.shape == (1, 0)


def test_resize_errors():
    x = np.zeros((1, 1, 2, 2), np.float32)
    with pytest.raises(InputError, match="only one"):
        run("Resize", x, None, np.ones(4, np.float32), np.ones(4, np.int64))
    with pytest.raises(InputError, match="must be given"):
        run("Resize", x, None, None, None)
    with pytest.raises(ShapeError, match="expected 4"):
        run("Resize", x, None, np.ones(3, np.float32))
    with pytest.raises(InputError, match="coordinate_transformation_mode"):
        run("Resize", x, None, np.ones(4, np.float32), coordinate_transformation_mode="nope")
    with pytest.raises(InputError, match="mode"):
        run("Resize", x, None, np.ones(4, np.float32), mode="area")


def test_resize_opset10_and_upsample():
    x = np.array([[[[1, 2], [3, 4]]]], np.float32)
    exp = np.array([[[[1, 1, 1, 2, 2, 2], [1, 1, 1, 2, 2, 2],
                      [3, 3, 3, 4, 4, 4], [3, 3, 3, 4, 4, 4]]]], np.float32)
    scales = np.array([1, 1, 2, 3], np.float32)
    np.testing.assert_array_equal(run("Resize", x, scales, opset=10, mode="nearest"), exp)
    np.testing.assert_array_equal(run("Upsample", x, scales, opset=9, mode="nearest"), exp)
    np.testing.assert_array_equal(
        run("Upsample", x, opset=7, mode="nearest", scales=[1.0, 1.0, 2.0, 3.0]), exp)
    # linear Upsample uses x_in = x_out / scale (asymmetric), clamped at the border
    y = run("Upsample", x, np.array([1, 1, 2, 2], np.float32), opset=9, mode="linear")
    exp_lin = naive_resize(x.astype(np.float64), (1, 1, 4, 4), [1, 1, 2, 2], "linear",
                           "asymmetric")
    np.testing.assert_allclose(y, exp_lin)
    # Resize-10 nearest when down-sampling takes ceil(x_out / scale)
    z = np.arange(10, dtype=np.float32).reshape(1, 10)
    np.testing.assert_array_equal(
        run("Resize", z, np.array([1, 0.5], np.float32), opset=10), [[0, 2, 4, 6, 8]])


# --------------------------------------------------------------------------------------------
# GridSample
# --------------------------------------------------------------------------------------------

def _reflect(c, lo, hi):
    span = hi - lo
    if span <= 0:
        return 0.0
    d = abs(c - lo)
    flips = math.floor(d / span)
    extra = d - flips * span
    return lo + extra if flips % 2 == 0 else hi - extra


def naive_grid_sample(x, grid, mode, padding, align):
    """Per output point, pytorch grid_sample semantics (N-D)."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    r = len(sp)
    out = np.zeros((n, c) + grid.shape[1:-1])
    for b in range(n):
        for o in itertools.product(*[range(k) for k in grid.shape[1:-1]]):
            coords = []
            for d in range(r):
                g = float(grid[(b,) + o + (r - 1 - d,)])
                size = sp[d]
                coords.append((g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2)

            def pad(cv, size):
                if padding == "border":
                    return min(max(cv, 0), size - 1)
                if padding == "reflection":
                    lo, hi = (0, size - 1) if align else (-0.5, size - 0.5)
                    return min(max(_reflect(cv, lo, hi), 0), size - 1)
                return cv

            per_dim = []
            for d, cv in enumerate(coords):
                size = sp[d]
                if mode == "nearest":
                    per_dim.append([(round(pad(cv, size)), 1.0)])  # round half to even
                elif mode == "linear":
                    cv = pad(cv, size)
                    f = math.floor(cv)
                    per_dim.append([(f, 1 - (cv - f)), (f + 1, cv - f)])
                else:
                    f = math.floor(cv)
                    per_dim.append([(round(pad(f + k, size)) if padding != "zeros" else f + k,
                                     _cubic(f + k - cv, -0.75)) for k in (-1, 0, 1, 2)])
            val = np.zeros(c)
            for combo in itertools.product(*per_dim):
                idx = [k for k, _ in combo]
                if all(0 <= k < s for k, s in zip(idx, sp)):
                    val += np.prod([w for _, w in combo]) * x[(b, slice(None)) + tuple(idx)]
            out[(b, slice(None)) + o] = val
    return out


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d_against_naive(mode, padding, align):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-1.7, 1.7, (2, 3, 6, 2)).astype(np.float32)
    y = run("GridSample", x, grid, opset=20, mode=mode, padding_mode=padding,
            align_corners=align)
    exp = naive_grid_sample(x.astype(np.float64), grid, mode, padding, align)
    assert y.shape == (2, 3, 3, 6) and y.dtype == np.float32
    np.testing.assert_allclose(y, exp, rtol=1e-4, atol=1e-5)
    old = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
    y16 = run("GridSample", x, grid, opset=16, mode=old, padding_mode=padding,
              align_corners=align)
    np.testing.assert_allclose(y16, y)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_3d_and_1d(mode):
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float64)
    grid = RNG.uniform(-1.2, 1.2, (1, 2, 3, 2, 3))
    y = run("GridSample", x, grid, opset=22, mode=mode, padding_mode="border")
    np.testing.assert_allclose(y, naive_grid_sample(x, grid, mode, "border", 0), atol=1e-12)
    x1 = RNG.standard_normal((2, 1, 7))
    g1 = RNG.uniform(-1, 1, (2, 5, 1))
    np.testing.assert_allclose(run("GridSample", x1, g1, opset=20, mode=mode),
                               naive_grid_sample(x1, g1, mode, "zeros", 0), atol=1e-12)


def test_grid_sample_int_and_errors():
    x = np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4)
    grid = np.array([[[[-1, -1], [1, 1], [0.1, -0.4]]]], np.float32)
    y = run("GridSample", x, grid, opset=20, mode="nearest", align_corners=1)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [[[[0, 15, 6]]]])
    with pytest.raises(ShapeError, match="grid"):
        run("GridSample", x, grid[..., :1], opset=20)
    with pytest.raises(ShapeError, match="4-D"):
        run("GridSample", x[0], grid[0], opset=16)
    with pytest.raises(InputError, match="padding_mode"):
        run("GridSample", x, grid, opset=20, padding_mode="wrap")


# --------------------------------------------------------------------------------------------
# AffineGrid
# --------------------------------------------------------------------------------------------

def naive_affine_grid(theta, size, align):
    n = size[0]
    sp = size[2:]
    r = len(sp)

    def lin(k):
        if k <= 1:
            return np.zeros(max(k, 0))
        i = np.arange(k)
        return -1 + 2 * i / (k - 1) if align else (2 * i + 1) / k - 1

    axes = [lin(k) for k in sp]
    out = np.zeros((n,) + tuple(sp) + (r,))
    for b in range(n):
        for o in itertools.product(*[range(k) for k in sp]):
            pos = [axes[d][o[d]] for d in reversed(range(r))] + [1.0]
            out[(b,) + o] = theta[b] @ np.array(pos)
    return out


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 4, 2), (1, 1, 1, 3)])
def test_affine_grid(align, size):
    r = len(size) - 2
    theta = RNG.standard_normal((size[0], r, r + 1)).astype(np.float32)
    y = run("AffineGrid", theta, np.array(size, np.int64), opset=20, align_corners=align)
    assert y.shape == (size[0],) + tuple(size[2:]) + (r,) and y.dtype == np.float32
    np.testing.assert_allclose(y, naive_affine_grid(theta.astype(np.float64), size, align),
                               rtol=1e-5, atol=1e-6)


def test_affine_grid_feeds_grid_sample_identity():
    x = RNG.standard_normal((1, 2, 4, 6)).astype(np.float32)
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    grid = run("AffineGrid", theta, np.array(x.shape, np.int64), opset=20, align_corners=0)
    y = run("GridSample", x, grid, opset=20, align_corners=0)
    np.testing.assert_allclose(y, x, atol=1e-5)
    with pytest.raises(ShapeError, match="theta"):
        run("AffineGrid", theta, np.array([1, 2, 3, 4, 5], np.int64), opset=20)
