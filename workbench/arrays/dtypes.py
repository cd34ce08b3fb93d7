"""Mapping between ONNX element types and numpy dtypes (ml_dtypes for the narrow floats/ints)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

try:
    import ml_dtypes as _mld
except Exception:  # pragma: no cover
    _mld = None

_ONNX_TO_NP: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.BOOL: np.dtype(np.bool_),
    TensorProto.STRING: np.dtype(object),
    TensorProto.COMPLEX64: np.dtype(np.complex64),
    TensorProto.COMPLEX128: np.dtype(np.complex128),
}

if _mld is not None:
    for _name, _attr in [
        ("BFLOAT16", "bfloat16"),
        ("FLOAT8E4M3FN", "float8_e4m3fn"),
        ("FLOAT8E4M3FNUZ", "float8_e4m3fnuz"),
        ("FLOAT8E5M2", "float8_e5m2"),
        ("FLOAT8E5M2FNUZ", "float8_e5m2fnuz"),
        ("FLOAT8E8M0", "float8_e8m0fnu"),
        ("INT4", "int4"),
        ("UINT4", "uint4"),
        ("INT2", "int2"),
        ("UINT2", "uint2"),
        ("FLOAT4E2M1", "float4_e2m1fn"),
        ("FLOAT6E2M3", "float6_e2m3fn"),
        ("FLOAT6E3M2", "float6_e3m2fn"),
    ]:
        if hasattr(TensorProto, _name) and hasattr(_mld, _attr):
            _ONNX_TO_NP[getattr(TensorProto, _name)] = np.dtype(getattr(_mld, _attr))

_NP_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in _ONNX_TO_NP.items()}
_NP_TO_ONNX[np.dtype(np.str_)] = TensorProto.STRING


def np_dtype_of_onnx(elem_type: int) -> np.dtype:
    """numpy dtype for an ONNX ``TensorProto.DataType`` value."""
    try:
        return _ONNX_TO_NP[int(elem_type)]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() \
            else str(elem_type)
        raise TypeError(f"ONNX element type {name} has no numpy equivalent here "
                        f"(supported: {sorted(dtype_name(k) for k in _ONNX_TO_NP)})") from None


def onnx_dtype_of_np(dtype) -> int:
    """ONNX ``TensorProto.DataType`` value for a numpy dtype."""
    dt = np.dtype(dtype)
    if dt.kind == "U":
        return TensorProto.STRING
    try:
        return _NP_TO_ONNX[dt]
    except KeyError:
        raise TypeError(f"numpy dtype {dt} has no ONNX equivalent") from None


def dtype_name(elem_type: int) -> str:
    """Lower-case ONNX name of an element type, e.g. ``float``, ``int64``."""
    try:
        return TensorProto.DataType.Name(int(elem_type)).lower()
    except ValueError:
        return f"type{elem_type}"
