"""Quantization kernels against numpy expectations written here (naive loops for the
quantized matmul / convolution)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from workbench.arrays import cupy_module
from workbench.errors import InputError, ShapeError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup

RNG = np.random.default_rng(0)


def run(op, *inputs, opset=25, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


# ------------------------------------------------------------------------- QuantizeLinear


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300, -300], np.float32)
    y = run("QuantizeLinear", x, np.array(1.0, np.float32), np.array(0, np.int8))
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [0, 2, 2, 0, -2, 127, -128])
    y = run("QuantizeLinear", x, np.array(1.0, np.float32), np.array(10, np.uint8))
    np.testing.assert_array_equal(y, [10, 12, 12, 10, 8, 255, 0])


def test_quantize_default_type_is_uint8():
    y = run("QuantizeLinear", np.array([1.0, -1.0], np.float32), np.array(0.5, np.float32),
            opset=10)
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, [2, 0])


def test_quantize_per_axis_negative_axis():
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    s = np.array([0.1, 0.2, 0.3], np.float32)
    zp = np.array([1, 2, 3], np.int8)
    y = run("QuantizeLinear", x, s, zp, axis=-2)
    ref = np.clip(np.rint(x / s[:, None]) + zp[:, None], -128, 127)
    np.testing.assert_array_equal(y, ref)
    with pytest.raises(ShapeError, match="per-axis"):
        run("QuantizeLinear", x, s, zp, axis=0)


def test_quantize_blocked_with_partial_last_block():
    x = RNG.normal(size=(2, 5)).astype(np.float32)
    s = np.array([[0.1, 0.5], [0.2, 0.4]], np.float32)  # ceil(5/3) = 2 blocks along axis 1
    y = run("QuantizeLinear", x, s, np.zeros((2, 2), np.int8), axis=1, block_size=3)
    full = np.repeat(s, 3, axis=1)[:, :5]
    np.testing.assert_array_equal(y, np.clip(np.rint(x / full), -128, 127))
    with pytest.raises(ShapeError, match="blocked"):
        run("QuantizeLinear", x, s, np.zeros((2, 2), np.int8), axis=1, block_size=2)


@pytest.mark.parametrize("elem, lo, hi", [(TensorProto.INT4, -8, 7), (TensorProto.UINT4, 0, 15),
                                          (TensorProto.INT2, -2, 1), (TensorProto.UINT2, 0, 3),
                                          (TensorProto.INT16, -32768, 32767),
                                          (TensorProto.UINT16, 0, 65535)])
def test_quantize_narrow_and_wide_ints_by_output_dtype(elem, lo, hi):
    x = np.array([-1e6, -2.5, -0.4, 0.6, 2.5, 1e6], np.float32)
    y = run("QuantizeLinear", x, np.array(1.0, np.float32), output_dtype=elem)
    ref = np.clip(np.rint(x), lo, hi)
    assert y.dtype.name == {TensorProto.INT4: "int4", TensorProto.UINT4: "uint4",
                            TensorProto.INT2: "int2", TensorProto.UINT2: "uint2",
                            TensorProto.INT16: "int16", TensorProto.UINT16: "uint16"}[elem]
    np.testing.assert_array_equal(y.astype(np.int64), ref)


def test_quantize_output_dtype_must_match_zero_point():
    with pytest.raises(InputError, match="differs"):
        run("QuantizeLinear", np.ones(2, np.float32), np.array(1.0, np.float32),
            np.array(0, np.int8), output_dtype=TensorProto.UINT8)


def test_quantize_float8_saturate_or_not():
    x = np.array([1000.0, -1000.0, np.inf, 0.3], np.float32)
    zp = np.array(0, ml_dtypes.float8_e4m3fn)
    y = run("QuantizeLinear", x, np.array(1.0, np.float32), zp)
    assert y.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(y.astype(np.float32), [448, -448, 448, 0.3125])
    y = run("QuantizeLinear", x, np.array(1.0, np.float32), zp, saturate=0)
    assert np.isnan(y.astype(np.float32)[:3]).all()
    big = np.array([1e5, -1e5, np.inf], np.float32)
    y = run("QuantizeLinear", big, np.array(1.0, np.float32),
            np.array(0, ml_dtypes.float8_e5m2), saturate=0)
    np.testing.assert_array_equal(y.astype(np.float32), [np.inf, -np.inf, np.inf])
    y = run("QuantizeLinear", big, np.array(1.0, np.float32), np.array(0, ml_dtypes.float8_e5m2))
    np.testing.assert_array_equal(y.astype(np.float32), [57344, -57344, 57344])


def test_quantize_float16_scale_and_int32_input():
    x = np.array([100, 300, -5], np.int32)
    y = run("QuantizeLinear", x, np.array(2.0, np.float16), np.array(0, np.int16))
    np.testing.assert_array_equal(y, [50, 150, -2])


def test_zero_dim_inputs_give_zero_dim_arrays():
    q = run("QuantizeLinear", np.array(1.5, np.float32), np.array(1.0, np.float32))
    d = run("DequantizeLinear", np.array(3, np.uint8), np.array(2.0, np.float32))
    y, _, _ = run("DynamicQuantizeLinear", np.array(3.0, np.float32), opset=11)
    for v in (q, d, y):
        assert isinstance(v, np.ndarray) and v.shape == ()
    assert int(q) == 2 and float(d) == 6.0


def test_quantize_empty_tensor():
    y = run("QuantizeLinear", np.zeros((0, 3), np.float32), np.array(1.0, np.float32))
    assert y.shape == (0, 3) and y.dtype == np.uint8


# ----------------------------------------------------------------------- DequantizeLinear


def test_dequantize_per_tensor_and_int32():
    x = np.array([0, 3, 128, 255], np.uint8)
    y = run("DequantizeLinear", x, np.array(2.0, np.float32), np.array(128, np.uint8))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [-256, -250, 0, 254])
    big = np.array([2**30, -(2**30)], np.int32)
    np.testing.assert_array_equal(run("DequantizeLinear", big, np.array(0.5, np.float32)),
                                  [2**29, -(2**29)])


def test_dequantize_blocked_int4_and_output_dtype():
    x = np.array([[-8, -1, 0, 7], [1, 2, 3, 4]], ml_dtypes.int4)
    s = np.array([[1.0, 2.0], [0.5, 4.0]], np.float32)
    zp = np.array([[0, 1], [1, 0]], ml_dtypes.int4)
    y = run("DequantizeLinear", x, s, zp, axis=-1, block_size=2,
            output_dtype=TensorProto.FLOAT16)
    assert y.dtype == np.float16
    full_s = np.repeat(s, 2, axis=1)
    full_z = np.repeat(zp.astype(np.int64), 2, axis=1)
    np.testing.assert_array_equal(y, (x.astype(np.int64) - full_z) * full_s)


def test_dequantize_per_axis_float8_and_bfloat16_scale():
    x = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    s = np.array([2.0, 0.5], ml_dtypes.bfloat16)
    y = run("DequantizeLinear", x, s, axis=0)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), [[2, 4], [1.5, -2]])


def test_quantize_dequantize_roundtrip_within_half_step():
    x = RNG.uniform(-3, 3, size=(4, 6)).astype(np.float32)
    s, zp = np.array(0.05, np.float32), np.array(3, np.int8)
    back = run("DequantizeLinear", run("QuantizeLinear", x, s, zp), s, zp)
    assert np.abs(back - x).max() <= 0.025 + 1e-6


# ------------------------------------------------------------------ DynamicQuantizeLinear


def test_dynamic_quantize_linear():
    x = np.array([-1.0, 0.0, 2.0, 3.0], np.float32)
    y, s, zp = run("DynamicQuantizeLinear", x, opset=11, n_outputs=3)
    scale = np.float32(4.0) / np.float32(255)
    assert s.dtype == np.float32 and s.shape == () and np.isclose(s, scale)
    assert zp.dtype == np.uint8 and int(zp) == int(np.rint(1 / scale))
    np.testing.assert_array_equal(y, np.clip(np.rint(x / scale) + int(zp), 0, 255))


def test_dynamic_quantize_all_zero_and_empty():
    y, s, zp = run("DynamicQuantizeLinear", np.zeros(3, np.float32), opset=11)
    assert float(s) == 0 and int(zp) == 0 and not y.any()
    y, s, zp = run("DynamicQuantizeLinear", np.zeros((0, 2), np.float32), opset=11)
    assert y.shape == (0, 2)


# -------------------------------------------------------------------------- QLinearMatMul


def naive_qmatmul(a, sa, za, b, sb, zb, sy, zy, lo, hi):
    acc = (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)
    return np.clip(np.rint(acc * (sa.astype(np.float64) * sb / sy)) + zy, lo, hi)


@pytest.mark.parametrize("ta, tb, ty", [(np.uint8, np.uint8, np.uint8),
                                        (np.int8, np.int8, np.int8),
                                        (np.uint8, np.int8, np.int8)])
def test_qlinear_matmul_batched(ta, tb, ty):
    ia, ib, iy = np.iinfo(ta), np.iinfo(tb), np.iinfo(ty)
    a = RNG.integers(ia.min, ia.max, size=(2, 3, 5), endpoint=True).astype(ta)
    b = RNG.integers(ib.min, ib.max, size=(5, 4), endpoint=True).astype(tb)
    sa, sb, sy = (np.array(v, np.float32) for v in (0.02, 0.03, 0.5))
    za, zb, zy = np.array(3, ta), np.array(-2 if tb == np.int8 else 5, tb), np.array(1, ty)
    y = run("QLinearMatMul", a, sa, za, b, sb, zb, sy, zy)
    assert y.dtype == ty and y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, naive_qmatmul(a, sa, za, b, sb, zb, sy, zy,
                                                   iy.min, iy.max))


def test_qlinear_matmul_per_row_and_column():
    a = RNG.integers(0, 255, size=(3, 4), endpoint=True).astype(np.uint8)
    b = RNG.integers(0, 255, size=(4, 2), endpoint=True).astype(np.uint8)
    sa, za = np.array([0.1, 0.2, 0.3], np.float32), np.array([1, 2, 3], np.uint8)
    sb, zb = np.array([0.01, 0.02], np.float32), np.array([4, 5], np.uint8)
    y = run("QLinearMatMul", a, sa, za, b, sb, zb, np.array(4.0, np.float32),
            np.array(128, np.uint8))
    ref = naive_qmatmul(a, sa[:, None], za[:, None].astype(np.int64), b, sb,
                        zb.astype(np.int64), np.float32(4.0), 128, 0, 255)
    np.testing.assert_array_equal(y, ref)


def test_qlinear_matmul_shape_error():
    z = np.array(0, np.uint8)
    s = np.array(1.0, np.float32)
    with pytest.raises(ShapeError, match="cannot multiply"):
        run("QLinearMatMul", np.zeros((2, 3), np.uint8), s, z, np.zeros((2, 3), np.uint8), s, z,
            s, z)


# ---------------------------------------------------------------------------- QLinearConv


def naive_qconv(x, xz, w, wz, b, strides, pads, dil, group):
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.int64) - xz, [(0, 0), (0, 0), (pads[0], pads[2]),
                                          (pads[1], pads[3])])
    oh = (xp.shape[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, m, oh, ow), np.int64)
    mg = m // group
    wz = np.broadcast_to(wz, (m,))
    for bi, mi, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = mi // mg
        for ci, p, q in itertools.product(range(cg), range(kh), range(kw)):
            out[bi, mi, i, j] += (xp[bi, g * cg + ci, i * strides[0] + p * dil[0],
                                     j * strides[1] + q * dil[1]]
                                  * (int(w[mi, ci, p, q]) - int(wz[mi])))
        if b is not None:
            out[bi, mi, i, j] += b[mi]
    return out


@pytest.mark.parametrize("group, strides, pads, dil", [
    (1, (1, 1), (0, 0, 0, 0), (1, 1)),
    (2, (2, 1), (1, 2, 0, 1), (1, 2)),
])
def test_qlinear_conv_against_naive_loops(group, strides, pads, dil):
    x = RNG.integers(0, 255, size=(2, 4, 6, 7), endpoint=True).astype(np.uint8)
    w = RNG.integers(-128, 127, size=(4, 4 // group, 3, 2), endpoint=True).astype(np.int8)
    b = RNG.integers(-500, 500, size=(4,)).astype(np.int32)
    xs, xz = np.array(0.02, np.float32), np.array(100, np.uint8)
    ws = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
    wz = np.zeros(4, np.int8)
    ys, yz = np.array(0.3, np.float32), np.array(5, np.int8)
    y = run("QLinearConv", x, xs, xz, w, ws, wz, ys, yz, b, opset=10, group=group,
            strides=list(strides), pads=list(pads), dilations=list(dil))
    acc = naive_qconv(x, int(xz), w, wz.astype(np.int64), b, strides, pads, dil, group)
    mult = (np.float64(xs) * ws.astype(np.float64) / np.float64(ys))[None, :, None, None]
    ref = np.clip(np.rint(acc * mult) + 5, -128, 127)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, ref)


def test_qlinear_conv_same_upper_keeps_spatial_size():
    x = RNG.integers(0, 255, size=(1, 2, 5, 5), endpoint=True).astype(np.uint8)
    w = RNG.integers(0, 255, size=(3, 2, 3, 3), endpoint=True).astype(np.uint8)
    one, z = np.array(0.01, np.float32), np.array(0, np.uint8)
    y = run("QLinearConv", x, one, z, w, one, z, np.array(1.0, np.float32), z, opset=10,
            auto_pad="SAME_UPPER")
    assert y.shape == (1, 3, 5, 5)
    acc = naive_qconv(x, 0, w, np.zeros(3, np.int64), None, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_array_equal(y, np.clip(np.rint(acc * 1e-4), 0, 255))


def test_qlinear_conv_channel_mismatch():
    x = np.zeros((1, 3, 4, 4), np.uint8)
    w = np.zeros((2, 2, 1, 1), np.uint8)
    s, z = np.array(1.0, np.float32), np.array(0, np.uint8)
    with pytest.raises(ShapeError, match="channels"):
        run("QLinearConv", x, s, z, w, s, z, s, z, opset=10)


def test_unknown_output_dtype_is_reported():
    with pytest.raises(InputError):
        run("QuantizeLinear", np.ones(2, np.float32), np.array(1.0, np.float32),
            output_dtype=TensorProto.FLOAT)


# ----------------------------------------------------------------------------------- GPU

def _has_gpu() -> bool:
    cp = cupy_module()
    try:
        return cp is not None and cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver or no device
        return False


requires_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
def test_quant_kernels_on_cupy_match_numpy():
    cp = cupy_module()
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    s = np.array([0.1, 0.2, 0.3], np.float32)
    zp = np.array([1, 2, 3], np.int8)
    q = run("QuantizeLinear", cp.asarray(x), cp.asarray(s), cp.asarray(zp), axis=1)
    assert isinstance(q, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(q), run("QuantizeLinear", x, s, zp, axis=1))
    d = run("DequantizeLinear", q, cp.asarray(s), cp.asarray(zp), axis=1)
    np.testing.assert_array_equal(cp.asnumpy(d), run("DequantizeLinear", cp.asnumpy(q), s, zp,
                                                     axis=1))
    a = RNG.integers(0, 255, size=(3, 4), endpoint=True).astype(np.uint8)
    b = RNG.integers(0, 255, size=(4, 2), endpoint=True).astype(np.uint8)
    sc, z = np.array(0.05, np.float32), np.array(7, np.uint8)
    ref = run("QLinearMatMul", a, sc, z, b, sc, z, sc, z)
    got = run("QLinearMatMul", *(cp.asarray(v) for v in (a, sc, z, b, sc, z, sc, z)))
    np.testing.assert_array_equal(cp.asnumpy(got), ref)
    xi = RNG.integers(0, 255, size=(1, 2, 5, 5), endpoint=True).astype(np.uint8)
    w = RNG.integers(0, 255, size=(4, 1, 3, 3), endpoint=True).astype(np.uint8)
    args = (xi, sc, z, w, sc, z, np.array(1.0, np.float32), z)
    ref = run("QLinearConv", *args, opset=10, group=2, pads=[1, 1, 1, 1])
    got = run("QLinearConv", *(cp.asarray(v) for v in args), opset=10, group=2,
              pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(cp.asnumpy(got), ref)
    y, ys, yz = run("DynamicQuantizeLinear", cp.asarray(x), opset=11)
    np.testing.assert_array_equal(cp.asnumpy(y), run("DynamicQuantizeLinear", x, opset=11)[0])
