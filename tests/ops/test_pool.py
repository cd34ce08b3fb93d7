"""Pooling kernels against a naive per-window loop reference written here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import pytest
from onnx import helper

from workbench.errors import ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(1)


def run(op, *inputs, opset=22, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


def reference(op, inputs, opset, n_outputs=1, **attrs):
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def ort_run(op, inputs, opset, **attrs):
    """onnxruntime as an oracle for one node (tests only)."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["o0"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info("o0", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))


def out_size(S, k, s, d, pb, pe, ceil_mode):
    span = S + pb + pe - ((k - 1) * d + 1)
    if ceil_mode:
        o = math.ceil(span / s) + 1
        if (o - 1) * s >= S + pb:
            o -= 1
        return o
    return span // s + 1


def naive_pool(x, kind, ks, st, dl, pads, ceil_mode=False, count_include_pad=False, p=2):
    """Per-window loop; positions in the explicit padding count as pads, beyond it not at all."""
    N, C = x.shape[:2]
    S = x.shape[2:]
    nd = len(S)
    pb, pe = pads[:nd], pads[nd:]
    out = [out_size(S[a], ks[a], st[a], dl[a], pb[a], pe[a], ceil_mode) for a in range(nd)]
    y = np.zeros((N, C, *out))
    idx = np.zeros((N, C, *out), np.int64)
    for n, c in itertools.product(range(N), range(C)):
        for o in itertools.product(*[range(v) for v in out]):
            vals, n_pad, where = [], 0, []
            for tap in itertools.product(*[range(k) for k in ks]):
                pos = [o[a] * st[a] - pb[a] + tap[a] * dl[a] for a in range(nd)]
                if all(0 <= pos[a] < S[a] for a in range(nd)):
                    vals.append(float(x[(n, c) + tuple(pos)]))
                    where.append(np.ravel_multi_index(pos, S))
                elif all(-pb[a] <= pos[a] < S[a] + pe[a] for a in range(nd)):
                    n_pad += 1
            if kind == "max":
                k = int(np.argmax(vals))
                y[(n, c) + o] = vals[k]
                idx[(n, c) + o] = (n * C + c) * int(np.prod(S)) + where[k]
            elif kind == "avg":
                y[(n, c) + o] = sum(vals) / (len(vals) + (n_pad if count_include_pad else 0))
            else:
                y[(n, c) + o] = sum(abs(v) ** p for v in vals) ** (1 / p)
    return y, idx


POOL_CASES = [
    # nd, kernel, stride, dilation, pads, ceil_mode
    (2, 3, 2, 1, 1, 0), (2, 3, 2, 1, 1, 1), (2, 2, 2, 1, 0, 1), (2, 3, 1, 1, 0, 0),
    (2, 3, 2, 2, 1, 1), (2, 2, 3, 1, 0, 1), (1, 3, 2, 1, 1, 1), (3, 2, 2, 1, 1, 0),
    (2, 3, 3, 1, 2, 1), (2, 5, 1, 1, 2, 0),
]


@pytest.mark.parametrize("nd,k,s,d,p,ceil", POOL_CASES)
def test_max_pool_vs_naive(nd, k, s, d, p, ceil):
    size = {1: 10, 2: 7, 3: 5}[nd]
    x = RNG.standard_normal((2, 3) + (size,) * nd).astype(np.float32)
    attrs = dict(kernel_shape=[k] * nd, strides=[s] * nd, dilations=[d] * nd,
                 pads=[p] * (2 * nd), ceil_mode=ceil)
    ref, ref_idx = naive_pool(x, "max", [k] * nd, [s] * nd, [d] * nd, [p] * (2 * nd), ceil)
    y = run("MaxPool", x, **attrs)
    np.testing.assert_array_equal(y, ref.astype(np.float32))
    y2, idx = run("MaxPool", x, n_outputs=2, **attrs)
    np.testing.assert_array_equal(y2, y)
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, ref_idx)


@pytest.mark.parametrize("nd,k,s,d,p,ceil", POOL_CASES)
@pytest.mark.parametrize("include", [0, 1])
def test_average_pool_vs_naive(nd, k, s, d, p, ceil, include):
    size = {1: 10, 2: 7, 3: 5}[nd]
    x = RNG.standard_normal((2, 3) + (size,) * nd).astype(np.float32)
    y = run("AveragePool", x, kernel_shape=[k] * nd, strides=[s] * nd, dilations=[d] * nd,
            pads=[p] * (2 * nd), ceil_mode=ceil, count_include_pad=include)
    ref, _ = naive_pool(x, "avg", [k] * nd, [s] * nd, [d] * nd, [p] * (2 * nd), ceil, include)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_average_pool_ceil_last_window_starts_on_pad():
    x = RNG.random((1, 3, 2, 2)).astype(np.float32)
    y = run("AveragePool", x, kernel_shape=[3, 3], strides=[3, 3], pads=[1] * 4, ceil_mode=1,
            count_include_pad=1)
    assert y.shape == (1, 3, 1, 1)
    np.testing.assert_allclose(y[..., 0, 0], x.sum(axis=(2, 3)) / 9, rtol=1e-6)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_pools_auto_pad_match_onnxruntime(auto_pad):
    # (onnx.reference gets SAME_LOWER with an odd total padding wrong: it drops a window)
    x = RNG.standard_normal((1, 2, 6, 7)).astype(np.float32)
    for op in ("MaxPool", "AveragePool"):
        attrs = dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad=auto_pad)
        (ref,) = ort_run(op, [x], 19, **attrs)
        np.testing.assert_allclose(run(op, x, opset=19, **attrs), ref, rtol=1e-5, atol=1e-6)


def test_max_pool_storage_order_column_major():
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    y, idx = run("MaxPool", x, n_outputs=2, kernel_shape=[2, 2], strides=[2, 2],
                 storage_order=1)
    np.testing.assert_array_equal(y, [[[[6, 8], [16, 18]]]])
    np.testing.assert_array_equal(idx, [[[[6, 16], [8, 18]]]])
    # batch/channel offsets stay row-major
    x2 = np.concatenate([x, x + 100], axis=1)
    _, idx2 = run("MaxPool", x2, n_outputs=2, kernel_shape=[2, 2], strides=[2, 2],
                  storage_order=1)
    np.testing.assert_array_equal(idx2[0, 1], idx[0, 0] + 25)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float64])
def test_max_pool_dtypes(dtype):
    x = RNG.integers(0, 100, (1, 2, 6, 6)).astype(dtype)
    y = run("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1])
    assert y.dtype == np.dtype(dtype)
    ref, _ = naive_pool(x.astype(np.float64), "max", [2, 2], [2, 2], [1, 1], [1] * 4)
    np.testing.assert_array_equal(y.astype(np.float64), ref)


def test_max_pool_large_image_parallel_blocks():
    # big enough for the blocked / threaded path
    x = RNG.standard_normal((4, 16, 40, 40)).astype(np.float32)
    y = run("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    xp_ = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    ref = np.full((4, 16, 20, 20), -np.inf, np.float32)
    for i, j in itertools.product(range(3), range(3)):
        ref = np.maximum(ref, xp_[:, :, i:i + 39:2, j:j + 39:2])
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool_vs_naive(p):
    x = RNG.standard_normal((1, 2, 7, 7)).astype(np.float32)
    y = run("LpPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, p=p)
    ref, _ = naive_pool(x, "lp", [3, 3], [2, 2], [1, 1], [1] * 4, p=p)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    # LpPool-1 takes p as a float
    y1 = run("LpPool", x, opset=1, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
             p=float(p))
    np.testing.assert_allclose(y1, ref, rtol=1e-5, atol=1e-6)


def test_global_pools():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(run("GlobalAveragePool", x), x.mean(axis=(2, 3), keepdims=True),
                               rtol=1e-6)
    np.testing.assert_array_equal(run("GlobalMaxPool", x), x.max(axis=(2, 3), keepdims=True))
    np.testing.assert_allclose(run("GlobalLpPool", x, p=3),
                               (np.abs(x) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3),
                               rtol=1e-5)
    h = x.astype(np.float16)
    assert run("GlobalAveragePool", h).dtype == np.float16
    x1 = RNG.standard_normal((2, 3, 8)).astype(np.float64)
    np.testing.assert_allclose(run("GlobalAveragePool", x1), x1.mean(-1, keepdims=True))


def test_pool_errors():
    x = np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(ShapeError, match="kernel_shape"):
        run("MaxPool", x, kernel_shape=[2])
    with pytest.raises(ShapeError, match="larger than the padded input"):
        run("AveragePool", x, kernel_shape=[5, 5])


def test_empty_batch_pool():
    x = np.zeros((0, 3, 6, 6), np.float32)
    assert run("MaxPool", x, kernel_shape=[2, 2]).shape == (0, 3, 5, 5)
    assert run("AveragePool", x, kernel_shape=[2, 2], strides=[2, 2]).shape == (0, 3, 3, 3)


def test_max_unpool_roundtrip():
    x = RNG.random((2, 3, 6, 6)).astype(np.float32) + 0.1
    y, idx = run("MaxPool", x, n_outputs=2, kernel_shape=[2, 2], strides=[2, 2])
    u = run("MaxUnpool", y, idx, kernel_shape=[2, 2], strides=[2, 2])
    assert u.shape == x.shape
    mask = u != 0
    np.testing.assert_array_equal(u[mask], x[mask])
    np.testing.assert_array_equal(run("MaxPool", u, kernel_shape=[2, 2], strides=[2, 2]), y)
    u2 = run("MaxUnpool", y, idx, np.array([2, 3, 7, 7]), kernel_shape=[2, 2], strides=[2, 2])
    assert u2.shape == (2, 3, 7, 7)
    np.testing.assert_array_equal(u2[:, :, :6, :6], u)


def test_max_roi_pool_vs_loop():
    x = RNG.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array([[0, 1, 1, 8, 6], [1, 0, 0, 11, 9], [1, 2.4, 3.6, 5.5, 7.5]], np.float32)
    y = run("MaxRoiPool", x, rois, pooled_shape=[3, 2], spatial_scale=1.0)
    assert y.shape == (3, 3, 3, 2)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (int(np.floor(v + 0.5)) for v in roi[1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        for ph, pw in itertools.product(range(3), range(2)):
            hs = min(max(int(np.floor(ph * rh / 3)) + y1, 0), 10)
            he = min(max(int(np.ceil((ph + 1) * rh / 3)) + y1, 0), 10)
            ws = min(max(int(np.floor(pw * rw / 2)) + x1, 0), 12)
            we = min(max(int(np.ceil((pw + 1) * rw / 2)) + x1, 0), 12)
            np.testing.assert_array_equal(y[r, :, ph, pw], x[b, :, hs:he, ws:we].max(axis=(1, 2)))


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_vs_reference(mode, ctm, sampling_ratio):
    x = RNG.standard_normal((2, 3, 10, 10)).astype(np.float32)
    rois = np.array([[0, 0, 9, 9], [0, 5, 4, 9], [5, 5, 9, 9], [-2, -1, 3.5, 11.2],
                     [2.2, 3.1, 2.3, 3.2]], np.float32)
    bi = np.array([0, 0, 1, 1, 0], np.int64)
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, output_height=3,
                 output_width=4, sampling_ratio=sampling_ratio, spatial_scale=1.0)
    (ref,) = reference("RoiAlign", [x, rois, bi], 16, **attrs)
    y = run("RoiAlign", x, rois, bi, opset=16, **attrs)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_roi_align_opset10_has_no_half_pixel():
    x = RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)
    rois = np.array([[1, 1, 6, 5]], np.float32)
    bi = np.array([0], np.int64)
    y10 = run("RoiAlign", x, rois, bi, opset=10, output_height=2, output_width=2)
    y16 = run("RoiAlign", x, rois, bi, opset=16, output_height=2, output_width=2,
              coordinate_transformation_mode="output_half_pixel")
    np.testing.assert_allclose(y10, y16, rtol=1e-6)
