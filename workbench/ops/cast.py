"""Cast, CastLike and BitCast between every ONNX element type.

Conversions follow the Cast spec:

* float -> integer truncates toward zero (out of range is undefined in the spec; numpy's
  wrap-around is kept); integer -> narrower integer keeps the low bits; anything -> bool is
  ``!= 0``; integer/float -> 4-bit and 2-bit integers keep the low bits (as ml_dtypes does);
* float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz round to nearest even; with ``saturate=1`` (the default)
  out-of-range values and infinities become +-max, with ``saturate=0`` they become NaN (or +-inf
  for e5m2); NaN stays NaN;
* float8e8m0 (a power of two) rounds with ``round_mode`` 'up' (default), 'down' or 'nearest'
  (ties up); out of range saturates to the largest/smallest power or, with ``saturate=0``,
  becomes NaN;
* strings parse plain and scientific numbers and 'NaN', 'INF', '+INF', '-INF' (any case);
  numbers become their shortest round-trip text (bools '1'/'0'), with NaN/INF/-INF spelled
  as in the spec.

The narrow types (bfloat16, float8, float4, int4, int2) are ml_dtypes dtypes and live on the
host; strings are numpy object arrays of ``str``.
"""

from __future__ import annotations

import numpy as np
import onnx  # dtype constants; string tensors are always host (object) arrays
from onnx import TensorProto

from workbench.arrays import to_numpy, xp_of
from workbench.arrays.dtypes import dtype_name, np_dtype_of_onnx, onnx_dtype_of_np
from workbench.errors import InputError, UnsupportedOperatorError
from workbench.ops._common import quiet
from workbench.ops.registry import kernel

# largest finite value of each float8 type (for saturation)
_FLOAT8_MAX = {
    TensorProto.FLOAT8E4M3FN: 448.0,
    TensorProto.FLOAT8E4M3FNUZ: 240.0,
    TensorProto.FLOAT8E5M2: 57344.0,
    TensorProto.FLOAT8E5M2FNUZ: 57344.0,
}
_E8M0 = getattr(TensorProto, "FLOAT8E8M0", None)
_ROUND_MODES = ("up", "down", "nearest")

# bits per element of the types stored below one byte
_SUBBYTE_BITS = {getattr(TensorProto, n): b for n, b in
                 (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
                 if hasattr(TensorProto, n)}


def _ml_kind(dtype) -> str | None:
    """'f', 'i' or 'u' for an ml_dtypes dtype (bfloat16, float8, int4, ...), None otherwise."""
    dtype = np.dtype(dtype)
    if dtype.kind != "V":
        return None
    name = dtype.name
    if "float" in name:
        return "f"
    return "u" if name.startswith("uint") else "i"


def _widen(x):
    """An exact copy of an ml_dtypes array in a plain numpy dtype (float32, int8 or uint8)."""
    kind = _ml_kind(x.dtype)
    if kind is None:
        return x
    return x.astype({"f": np.float32, "i": np.int8, "u": np.uint8}[kind])


def _target_dtype(op: str, to: int):
    try:
        return np_dtype_of_onnx(to)
    except (TypeError, ValueError):
        raise UnsupportedOperatorError(
            op, reason=f"the target element type {dtype_name(to)} ({to}) has no array dtype "
                       f"here (supported: the TensorProto.DataType values of onnx "
                       f"{onnx.__version__} other than UNDEFINED)") from None


def cast_to(x, to: int, *, saturate: int = 1, round_mode: str = "up", op: str = "Cast"):
    """Convert ``x`` to the ONNX element type ``to`` (a ``TensorProto.DataType`` value).

    >>> import numpy as np
    >>> cast_to(np.array([1.7, -1.7, np.nan]), TensorProto.INT32)[:2]
    array([ 1, -1], dtype=int32)
    """
    dst = _target_dtype(op, to)
    src = x.dtype
    if to == TensorProto.STRING:
        return x if src.kind == "O" else _to_strings(x)
    if src.kind in "OUS":
        return _from_strings(x, to, dst, saturate, round_mode, op)
    if src == dst:
        return x
    xp = xp_of(x)
    if xp is not np and (_ml_kind(dst) or _ml_kind(src)):  # pragma: no cover - GPU only
        err = UnsupportedOperatorError(
            op, reason=f"{dst if _ml_kind(dst) else src} has no device (cupy) dtype; "
                       f"cast on the host instead")
        err.host_dtype = True  # a device plan re-runs the node on the host
        raise err
    if to in _FLOAT8_MAX:
        return _to_float8(x, dst, _FLOAT8_MAX[to], saturate)
    if to == _E8M0:
        return _to_e8m0(x, dst, saturate, round_mode, op)
    with quiet():
        return _widen(x).astype(dst)


def _to_float8(x, dst, fmax, saturate):
    """Host only (float8 has no cupy dtype)."""
    x = _widen(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    with quiet():
        if saturate:
            x = np.clip(x, -fmax, fmax)  # NaN stays NaN, +-inf become +-max
        return x.astype(dst)


def _to_e8m0(x, dst, saturate, round_mode, op):
    """Round |x| to a power of two 2**(E - 127), E in [0, 254]; E = 255 is NaN (host only)."""
    if round_mode not in _ROUND_MODES:
        raise InputError(f"{op}: round_mode must be one of {_ROUND_MODES}, got {round_mode!r}")
    x = _widen(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    with quiet():
        a = np.abs(x)
        m, e = np.frexp(a)  # a = m * 2**e with m in [0.5, 1)
        k = e.astype(np.int32) - 1  # a in [2**k, 2**(k+1))
        if round_mode == "up":
            k += m > 0.5
        elif round_mode == "nearest":
            k += m >= 0.75  # a >= 1.5 * 2**k: nearer (or tied) to 2**(k+1)
        biased = k + 127
        low = (biased < 0) | (a == 0)
        high = (biased > 254) | np.isinf(a)
        out = np.clip(biased, 0, 254).astype(np.uint8)
        out[low] = 0  # the smallest power, 2**-127
        out[high] = 254  # the largest, 2**127
        if not saturate:
            out[low | high] = 255
        out[np.isnan(a)] = 255
    return out.view(dst)


_SPECIAL_TEXT = {"nan": "NaN", "inf": "INF", "-inf": "-INF"}


def _to_strings(x):
    """Numbers as text: shortest round-trip form in their own precision; NaN, INF, -INF."""
    x = _widen(to_numpy(x))
    if x.dtype == bool:
        x = x.astype(np.uint8)  # "1" / "0", like bool -> number casts
    text = x.astype(np.str_)
    out = text.astype(object)
    if x.dtype.kind == "f":
        for raw, spelled in _SPECIAL_TEXT.items():
            out[text == raw] = spelled
    return out


def _parse_float(s) -> float:
    s = s.decode("utf-8") if isinstance(s, bytes) else str(s)
    try:
        return float(s.strip())  # also takes "NaN", "INF", "+INF", "-inf", "1e-5", "1E8"
    except ValueError:
        raise InputError(f"Cast: the string {s!r} is not a number") from None


def _parse_int(s) -> int:
    t = s.decode("utf-8") if isinstance(s, bytes) else str(s)
    try:
        return int(t.strip())
    except ValueError:
        v = _parse_float(s)
        return int(v) if np.isfinite(v) else 0  # "2.718" -> 2 (undefined in the spec)


def _parse_bool(s) -> bool:
    t = (s.decode("utf-8") if isinstance(s, bytes) else str(s)).strip().lower()
    if t in ("true", "false"):
        return t == "true"
    return _parse_float(s) != 0


def _from_strings(x, to, dst, saturate, round_mode, op):
    flat = np.asarray(x).ravel()
    if dst.kind == "b":
        return np.array([_parse_bool(s) for s in flat], dtype=bool).reshape(x.shape)
    if dst.kind in "iu" or _ml_kind(dst) in ("i", "u"):
        bits = _SUBBYTE_BITS.get(to, dst.itemsize * 8)
        mask = (1 << bits) - 1
        vals = [_parse_int(s) & mask for s in flat]  # keep the low bits, like int -> int casts
        signed = dst.kind == "i" or _ml_kind(dst) == "i"
        if signed:
            vals = [v - (1 << bits) if v >> (bits - 1) else v for v in vals]
        arr = np.array(vals, dtype=np.int64 if signed else np.uint64).reshape(x.shape)
        return arr.astype(dst)
    values = np.array([_parse_float(s) for s in flat], dtype=np.float64).reshape(x.shape)
    return cast_to(values, to, saturate=saturate, round_mode=round_mode, op=op)


# casts that are one numpy astype whatever the values (cast_to's own result for them): a
# transformer's attention-mask Cast at batch 1 spent more in cast_to's checks than in the copy
_PLAIN_SOURCES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                  np.uint32, np.uint64)
_PLAIN_TARGETS = {TensorProto.FLOAT: np.dtype(np.float32), TensorProto.DOUBLE: np.dtype(np.float64),
                  TensorProto.INT32: np.dtype(np.int32), TensorProto.INT64: np.dtype(np.int64),
                  TensorProto.BOOL: np.dtype(np.bool_)}


@kernel("Cast", since=6, category="shape", host_shape_math=True)
def cast(x, *, to, saturate=1, round_mode="up"):
    """Cast to element type ``to``; ``saturate`` (opset 19+) and ``round_mode`` (float8e8m0)."""
    if type(x) is np.ndarray and x.dtype.type in _PLAIN_SOURCES:
        dst = _PLAIN_TARGETS.get(to)
        if dst is not None:   # bool/integer to a plain numpy type: one astype (no warnings)
            return x if x.dtype == dst else x.astype(dst)
    return cast_to(x, to, saturate=saturate, round_mode=round_mode, op="Cast")


@kernel("CastLike", since=15, category="shape")
def cast_like(x, target_type, *, saturate=1, round_mode="up"):
    """Cast to the element type of ``target_type`` (its values are not used)."""
    try:
        to = onnx_dtype_of_np(target_type.dtype)
    except TypeError:
        raise UnsupportedOperatorError(
            "CastLike", reason=f"target dtype {target_type.dtype} has no ONNX type") from None
    return cast_to(x, to, saturate=saturate, round_mode=round_mode, op="CastLike")


def _bit_width(op: str, dtype) -> int:
    try:
        t = onnx_dtype_of_np(dtype)
    except TypeError:
        raise UnsupportedOperatorError(op, reason=f"dtype {dtype} has no ONNX type") from None
    if t == TensorProto.STRING:
        raise InputError(f"{op}: string tensors cannot be bit-cast")
    return _SUBBYTE_BITS.get(t, np.dtype(dtype).itemsize * 8)


@kernel("BitCast", since=26)
def bitcast(x, *, to):
    """Reinterpret the bits of ``x`` as element type ``to`` of the same bit width."""
    dst = _target_dtype("BitCast", to)
    src_bits, dst_bits = _bit_width("BitCast", x.dtype), _bit_width("BitCast", dst)
    if src_bits != dst_bits:
        raise InputError(f"BitCast: {x.dtype} ({src_bits} bits) cannot be reinterpreted as "
                         f"{dtype_name(to)} ({dst_bits} bits): the widths must be equal")
    if dst == np.dtype(bool):  # only 0 and 1 are valid bools
        return x.view(np.uint8) != 0 if x.dtype != bool else x
    if not x.flags.c_contiguous and x.ndim:
        x = xp_of(x).ascontiguousarray(x)
    return x.view(dst)
