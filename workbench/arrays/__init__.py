"""Arrays and dtypes: numpy on CPU, cupy on GPU, through one code path.

Kernels never import numpy directly for array work; they call :func:`xp_of` on their inputs and
use the returned module. ``workbench.arrays.cuda`` holds GPU-only fast paths.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays.dtypes import (  # noqa: F401
    dtype_name,
    np_dtype_of_onnx,
    onnx_dtype_of_np,
)

try:  # cupy is optional: the package imports and works without it
    import cupy as _cupy  # type: ignore
except Exception:  # pragma: no cover - depends on the machine
    _cupy = None


def cupy_module():
    """Return the cupy module, or None when cupy is not importable."""
    return _cupy


def xp_of(*arrays):
    """The array module (numpy or cupy) of the first array-like argument that has one."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
            if isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, _cupy.ndarray):
                        return _cupy
    return np


#: numpy dtype kinds the GPU array library (cupy) can hold: bool, ints, floats, complex
_DEVICE_KINDS = frozenset("biufc")


def device_dtype_ok(dtype) -> bool:
    """True when arrays of ``dtype`` can live on the GPU (cupy has the dtype).

    cupy has bool, the (u)int8..64, float16/32/64 and complex64/128. The ml_dtypes types
    (bfloat16, float8, float4, float6, int4, int2) and strings (object arrays) have no cupy
    dtype: values of those types stay on the host in a device plan (see
    ``workbench.runtime.placement``)."""
    dt = np.dtype(dtype)
    return dt.kind in _DEVICE_KINDS and dt.type.__module__ == "numpy"


def is_array(x) -> bool:
    if isinstance(x, np.ndarray):
        return True
    return _cupy is not None and isinstance(x, _cupy.ndarray)


def to_numpy(x):
    """Copy an array (numpy, cupy or scalar) to a numpy array on the host."""
    if _cupy is not None and isinstance(x, _cupy.ndarray):
        return _cupy.asnumpy(x)
    return np.asarray(x)
