"""Quantization kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv.

Granularities (QuantizeLinear/DequantizeLinear): per tensor (scalar scale), per axis (1-D scale
along ``axis``) and blocked (scale of the input's rank, ``block_size`` elements per scale along
``axis``). Integer targets round half to even and saturate to the type's range; float8/float4
targets clamp to the largest finite value when ``saturate`` is set. The narrow types (int4,
uint4, int2, uint2, float8*, float4e2m1, bfloat16) are the ml_dtypes dtypes; they exist on numpy
only.

Integer matrix products (QLinearMatMul, QLinearConv) are computed exactly in float64 through
BLAS: every product of two 8-bit values and every sum of them fits in float64's 53-bit mantissa
for any realistic reduction length.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.arrays import np_dtype_of_onnx, xp_of
from workbench.arrays.geometry import window_geometry
from workbench.errors import InputError, ShapeError
from workbench.ops._integer import (
    IntegerArithmetic,
    arithmetic_of,
    saturated_product,
    saturates,
)
from workbench.ops.registry import kernel

try:
    import ml_dtypes as _mld
except Exception:  # pragma: no cover - ml_dtypes is a dependency
    _mld = None

_NARROW_INTS = {"int4", "uint4", "int2", "uint2"}
_NARROW_FLOATS = {"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                  "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn",
                  "float6_e3m2fn"}
_STD_FLOATS = {"float16", "float32", "float64"}
# ONNX element types that dtypes.py may not map yet (opset 28 float6)
_EXTRA_ONNX = {27: "float6_e2m3fn", 28: "float6_e3m2fn"}


def _is_int(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind in "iu" or dt.name in _NARROW_INTS


def _is_float(dt) -> bool:
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name in _NARROW_FLOATS


def _int_range(dt) -> tuple[int, int]:
    dt = np.dtype(dt)
    info = np.iinfo(dt) if dt.kind in "iu" else _mld.iinfo(dt)
    return int(info.min), int(info.max)


def _onnx_dtype(op: str, elem_type: int):
    try:
        return np_dtype_of_onnx(elem_type)
    except TypeError:
        name = _EXTRA_ONNX.get(int(elem_type))
        if name and _mld is not None and hasattr(_mld, name):
            return np.dtype(getattr(_mld, name))
        raise InputError(f"{op}: output_dtype {elem_type} is not a supported element "
                         f"type") from None


def _compute_dtype(scale_dtype, precision: int):
    """Float dtype in which x / scale is computed: ``precision``, else the scale's type."""
    if precision:
        return np.dtype(np_dtype_of_onnx(precision))
    dt = np.dtype(scale_dtype)
    if dt.name in _STD_FLOATS or dt.name == "bfloat16":
        return dt
    return np.dtype(np.float32)  # int32 or float8e8m0 scales


def _to_float(a, dt=np.float32):
    """Cast to a numpy/cupy float dtype, going through float32 for the ml_dtypes types."""
    dt = np.dtype(dt)
    if a.dtype == dt:
        return a
    if a.dtype.name in _NARROW_FLOATS or a.dtype.name in _NARROW_INTS:
        a = a.astype(np.float32)
    return a.astype(dt)


def _expand_param(op: str, name: str, p, x_shape, axis: int, block_size: int):
    """Reshape a scale/zero-point so it broadcasts against x (per-tensor, per-axis, blocked)."""
    xp = xp_of(p)
    r = len(x_shape)
    if block_size <= 0:
        if p.size == 1 and p.ndim <= 1:  # per tensor ([] or [1])
            return p.reshape(())
        if p.ndim != 1:
            raise ShapeError(f"{op}: {name} of shape {tuple(p.shape)} needs block_size > 0 "
                             f"(blocked quantization); per-axis {name} must be 1-D")
        if r == 1 and not -1 <= axis < 1:
            axis = 0
        if not -r <= axis < r:
            raise ShapeError(f"{op}: axis {axis} is out of range for input of rank {r}")
        axis %= r
        if p.shape[0] != x_shape[axis]:
            raise ShapeError(f"{op}: per-axis {name} has {p.shape[0]} elements but the input "
                             f"(shape {tuple(x_shape)}) has {x_shape[axis]} along axis {axis}")
        shape = [1] * r
        shape[axis] = -1
        return p.reshape(shape)
    if not -r <= axis < r:
        raise ShapeError(f"{op}: axis {axis} is out of range for input of rank {r}")
    axis %= r
    expected = list(x_shape)
    expected[axis] = math.ceil(x_shape[axis] / block_size)
    if p.ndim != r or list(p.shape) != expected:
        raise ShapeError(f"{op}: blocked {name} must have shape {tuple(expected)} for input "
                         f"shape {tuple(x_shape)}, axis {axis} and block_size {block_size}; got "
                         f"{tuple(p.shape)}")
    p = xp.repeat(p, block_size, axis=axis)
    return p[(slice(None),) * axis + (slice(0, x_shape[axis]),)]


def _saturate_cast(y, out_dtype, saturate: bool):
    """Round/clamp a float array into ``out_dtype`` (integer or narrow float)."""
    out_dtype = np.dtype(out_dtype)
    xp = xp_of(y)
    y = xp.asarray(y)  # ufuncs turn 0-d arrays into numpy scalars
    if _is_int(out_dtype):
        lo, hi = _int_range(out_dtype)
        y = xp.asarray(xp.clip(xp.rint(y.astype(np.float64)), lo, hi))
        if out_dtype.name in _NARROW_INTS:
            return y.astype(np.int64).astype(out_dtype)
        return y.astype(out_dtype)
    y = y.astype(np.float32)
    if saturate and out_dtype.name in _NARROW_FLOATS and out_dtype.name != "bfloat16":
        fmax = float(_mld.finfo(out_dtype).max)
        y = xp.asarray(xp.clip(y, -fmax, fmax))
    return y.astype(out_dtype)


def _quantize(x, scale, zero_point, out_dtype, saturate: bool, compute_dtype):
    xs = _to_float(x, compute_dtype) / _to_float(scale, compute_dtype)
    if _is_int(out_dtype):
        xp = xp_of(xs)
        q = xp.rint(_to_float(xs, np.float64))
        if zero_point is not None:
            q = q + zero_point.astype(np.int64).astype(np.float64)
        return _saturate_cast(q, out_dtype, saturate)
    if zero_point is not None:
        xs = _to_float(xs, np.float32) + _to_float(zero_point, np.float32)
    return _saturate_cast(xs, out_dtype, saturate)


@kernel("QuantizeLinear", since=10)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0):
    """One kernel for opsets 10..28: later versions only add attributes whose defaults give
    the earlier behaviour (axis 13, saturate 19, block_size/output_dtype 21, precision 23)."""
    op = "QuantizeLinear"
    if y_zero_point is not None:
        out_dtype = y_zero_point.dtype
        if output_dtype and _onnx_dtype(op, output_dtype) != out_dtype:
            raise InputError(f"{op}: output_dtype {np.dtype(_onnx_dtype(op, output_dtype))} "
                             f"differs from y_zero_point's dtype {out_dtype}")
    elif output_dtype:
        out_dtype = _onnx_dtype(op, output_dtype)
    else:
        out_dtype = np.dtype(np.uint8)
    if not (_is_int(out_dtype) or np.dtype(out_dtype).name in _NARROW_FLOATS):
        raise InputError(f"{op}: unsupported quantized type {out_dtype} (supported: int/uint "
                         f"2/4/8/16, float8 variants, float4e2m1)")
    scale = _expand_param(op, "y_scale", y_scale, x.shape, axis, block_size)
    zp = (None if y_zero_point is None
          else _expand_param(op, "y_zero_point", y_zero_point, x.shape, axis, block_size))
    return _quantize(x, scale, zp, out_dtype, bool(saturate),
                     _compute_dtype(y_scale.dtype, precision))


@kernel("DequantizeLinear", since=10)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """One kernel for opsets 10..28 (axis 13, float8 19, blocked 21, output_dtype 23)."""
    op = "DequantizeLinear"
    if output_dtype:
        out_dtype = np.dtype(_onnx_dtype(op, output_dtype))
    elif x_scale.dtype.name in _STD_FLOATS or x_scale.dtype.name == "bfloat16":
        out_dtype = x_scale.dtype
    else:
        out_dtype = np.dtype(np.float32)
    scale = _expand_param(op, "x_scale", x_scale, x.shape, axis, block_size)
    if _is_int(x.dtype):
        diff = x.astype(np.int64)
        if x_zero_point is not None:
            zp = _expand_param(op, "x_zero_point", x_zero_point, x.shape, axis, block_size)
            diff = diff - zp.astype(np.int64)
        # int32/uint16 differences are exact in float64; 8-bit ones in float32 already
        wide = np.float64 if x.dtype.itemsize > 1 else np.float32
        diff = diff.astype(wide)
    elif _is_float(x.dtype):
        diff = _to_float(x, np.float32)
        if x_zero_point is not None:
            zp = _expand_param(op, "x_zero_point", x_zero_point, x.shape, axis, block_size)
            diff = diff - _to_float(zp, np.float32)
    else:
        raise InputError(f"{op}: unsupported input dtype {x.dtype}")
    return xp_of(x).asarray(_to_float(diff, out_dtype) * _to_float(scale, out_dtype))


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    xp = xp_of(x)
    xf = x.astype(np.float32)
    if xf.size:
        x_min = min(float(xf.min()), 0.0)
        x_max = max(float(xf.max()), 0.0)
    else:
        x_min = x_max = 0.0
    scale = np.float32((np.float32(x_max) - np.float32(x_min)) / np.float32(255.0))
    if scale == 0:
        zp = np.uint8(0)
        y = xp.zeros(x.shape, dtype=np.uint8)
    else:
        zp = np.uint8(np.clip(np.rint(np.float32(0.0) - np.float32(x_min) / scale), 0, 255))
        q = xp.rint(xf / scale) + np.float32(zp)
        y = xp.asarray(xp.clip(q, 0, 255)).astype(np.uint8)
    return y, xp.asarray(scale, dtype=np.float32), xp.asarray(zp, dtype=np.uint8)


def _centered(a, zero_point, *, per_row: bool):
    """a - zero_point as float64 (integers) or float32 (float8), zero point broadcast per row
    (for the left operand: 1-D of length M becomes [M, 1]) or per column."""
    if _is_int(a.dtype):
        out = a.astype(np.float64)
        zp = zero_point.astype(np.float64) if zero_point is not None else None
    else:
        out = _to_float(a, np.float32)
        zp = _to_float(zero_point, np.float32) if zero_point is not None else None
    if zp is None:
        return out
    return out - _row_col(zp, per_row, a.ndim)


def _row_col(p, per_row: bool, ndim: int):
    if p.ndim == 1 and p.shape[0] != 1 and per_row and ndim >= 2:
        return p.reshape(-1, 1)
    return p


@kernel("QLinearMatMul", since=10, category="layer")
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point,
                   *, integer_arithmetic=IntegerArithmetic.EXACT):
    """y = saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp).

    One kernel for opsets 10 and 21 (21 adds float16/bfloat16 scales and float8 types).
    ``integer_arithmetic``: see ops/_integer.py."""
    op = "QLinearMatMul"
    xp = xp_of(a, b)
    if saturates(arithmetic_of(op, integer_arithmetic), a.dtype, b.dtype):
        acc = saturated_product(op, a, _row_col(a_zero_point, True, a.ndim), b, b_zero_point)
    else:
        try:
            acc = xp.matmul(_centered(a, a_zero_point, per_row=True),
                            _centered(b, b_zero_point, per_row=False))
        except ValueError:
            raise ShapeError(f"{op}: cannot multiply shapes {tuple(a.shape)} and "
                             f"{tuple(b.shape)}") from None
    multiplier = (_row_col(a_scale.astype(np.float64), True, a.ndim)
                  * b_scale.astype(np.float64) / y_scale.astype(np.float64))
    real = acc.astype(np.float64) * multiplier
    if _is_int(y_zero_point.dtype):
        q = xp.rint(real) + y_zero_point.astype(np.float64)
        return _saturate_cast(q, y_zero_point.dtype, True)
    return _saturate_cast(real + _to_float(y_zero_point, np.float64), y_zero_point.dtype, True)


def _conv_pads(op, in_sp, ks, strides, dilations, pads, auto_pad):
    pb, pe, _, _ = window_geometry(op, in_sp, ks, strides, dilations, pads, auto_pad)
    return pb + pe


def _im2col(op, x, ks, group, strides, dilations, pads, pad_value=0, channels_last=False):
    """The windows of ``x`` (N, C, *sp) padded with ``pad_value``, one row per output position:
    (group, N*P, K) and the output's spatial shape. K runs (C/group, *kernel) - or, with
    ``channels_last``, (*kernel, C/group): the channels of one tap adjacent, the order of an
    NHWC convolution such as onnxruntime's."""
    xp = xp_of(x)
    n, c = x.shape[:2]
    nd = len(ks)
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    xpad = xp.pad(x, widths, constant_values=pad_value) if any(pads) else x
    out_sp = tuple((xpad.shape[2 + i] - dilations[i] * (ks[i] - 1) - 1) // strides[i] + 1
                   for i in range(nd))
    if any(o <= 0 for o in out_sp):
        raise ShapeError(f"{op}: output spatial shape {out_sp} is empty for input "
                         f"{tuple(x.shape)}, kernel {ks}, pads {pads}, strides {strides}")
    xpad = xp.ascontiguousarray(xpad)
    st = xpad.strides
    view = xp.lib.stride_tricks.as_strided(
        xpad, (n, c) + out_sp + tuple(ks),
        st[:2] + tuple(st[2 + i] * strides[i] for i in range(nd))
        + tuple(st[2 + i] * dilations[i] for i in range(nd)))
    cg = c // group
    kk = int(np.prod(ks)) if ks else 1
    p = int(np.prod(out_sp)) if out_sp else 1
    view = view.reshape((n, group, cg) + out_sp + tuple(ks))
    # (group, N, *out, Cg, *k) or (group, N, *out, *k, Cg) -> (group, N*P, K): the im2col copy
    taps = tuple(range(3 + nd, 3 + 2 * nd))
    inner = taps + (2,) if channels_last else (2,) + taps
    order = (1, 0) + tuple(range(3, 3 + nd)) + inner
    return view.transpose(order).reshape(group, n * p, cg * kk), out_sp


def _weights_as_columns(w, group, channels_last=False):
    """w (M, C/group, *k) as (group, K, M/group), K ordered like :func:`_im2col`'s."""
    m, cg = w.shape[:2]
    nd = w.ndim - 2
    if channels_last:
        w = w.transpose((0,) + tuple(range(2, 2 + nd)) + (1,))
    return w.reshape(group, m // group, -1).transpose(0, 2, 1)


def _conv_output(acc, n, out_sp):
    """(group, N*P, M/group) -> (N, M, *out)."""
    group, _, mg = acc.shape
    nd = len(out_sp)
    out = acc.reshape((group, n) + out_sp + (mg,))
    out = out.transpose((1, 0, 2 + nd) + tuple(range(2, 2 + nd)))
    return out.reshape((n, group * mg) + out_sp)


def _conv_exact(x, w, group, strides, dilations, pads):
    """N-D grouped convolution of float arrays by im2col (as_strided view) + one batched
    matmul. x: (N, C, *sp), w: (M, C/group, *k); returns (N, M, *out)."""
    xp = xp_of(x, w)
    cols, out_sp = _im2col("QLinearConv", x, tuple(w.shape[2:]), group, strides, dilations,
                           pads)
    return _conv_output(xp.matmul(cols, _weights_as_columns(w, group)), x.shape[0], out_sp)


def _exact_depthwise(w, group, w_zero_point) -> bool:
    """onnxruntime's depthwise kernel (one input and one output channel per group, one weight
    zero point for all channels) sums its products exactly, also without VNNI; other grouped
    convolutions go through its u8 x s8 GEMM."""
    if w.shape[0] != group or w.shape[1] != 1:
        return False
    z = w_zero_point.reshape(-1)
    return z.size == 1 or bool((z == z[0]).all())


def _conv_saturated(x, x_zero_point, w, w_zero_point, group, strides, dilations, pads):
    """The convolution's (x - x_zp) * (w - w_zp) sums as onnxruntime computes uint8 x int8
    ones without VNNI (ops/_integer.py): on the raw values in its NHWC order (the channels of
    one tap adjacent), padding with the zero point, the zero points taken out afterwards."""
    m = w.shape[0]
    xz = x_zero_point.reshape(())
    cols, out_sp = _im2col("QLinearConv", x, tuple(w.shape[2:]), group, strides, dilations,
                           pads, pad_value=xz, channels_last=True)
    wz = w_zero_point.reshape(-1)
    wz = wz.reshape(group, 1, m // group) if wz.size > 1 else wz.reshape(())
    acc = saturated_product("QLinearConv", cols, xz, _weights_as_columns(w, group, True), wz)
    return _conv_output(acc, x.shape[0], out_sp)


@kernel("QLinearConv", since=10, category="layer")
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None, integer_arithmetic=IntegerArithmetic.EXACT):
    op = "QLinearConv"
    xp = xp_of(x, w)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ShapeError(f"{op}: x {tuple(x.shape)} and w {tuple(w.shape)} must be N-D "
                         f"(N, C, spatial...) with the same rank >= 3")
    nd = x.ndim - 2
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ShapeError(f"{op}: x channels {x.shape[1]} must equal w.shape[1] "
                         f"({w.shape[1]}) * group ({group}) and w.shape[0] ({w.shape[0]}) "
                         f"must be divisible by group")
    if kernel_shape and list(kernel_shape) != list(w.shape[2:]):
        raise ShapeError(f"{op}: kernel_shape {list(kernel_shape)} differs from the weight's "
                         f"spatial shape {list(w.shape[2:])}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    pads = _conv_pads(op, x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    m = w.shape[0]
    if saturates(arithmetic_of(op, integer_arithmetic), x.dtype, w.dtype) \
            and not _exact_depthwise(w, group, w_zero_point):
        acc = _conv_saturated(x, x_zero_point, w, w_zero_point, group, strides, dilations,
                              pads)
    else:
        xc = x.astype(np.float64) - x_zero_point.astype(np.float64).reshape(())
        wzp = w_zero_point.astype(np.float64)
        wzp = wzp.reshape((-1,) + (1,) * (nd + 1)) if wzp.size > 1 else wzp.reshape(())
        wc = w.astype(np.float64) - wzp
        acc = _conv_exact(xc, wc, group, strides, dilations, pads)
    if B is not None:
        acc = acc + B.astype(np.float64).reshape((1, m) + (1,) * nd)
    ws = w_scale.astype(np.float64)
    ws = ws.reshape((1, -1) + (1,) * nd) if ws.size > 1 else ws.reshape(())
    real = acc * (x_scale.astype(np.float64).reshape(()) * ws / y_scale.astype(np.float64)
                  .reshape(()))
    q = xp.rint(real) + y_zero_point.astype(np.float64).reshape(())
    return _saturate_cast(q, y_zero_point.dtype, True)
