"""Small helpers shared by several op families (not a family: it registers no kernel).

A helper lives here only when several families need the very same behaviour; a variant with its
own accepted range or error message stays in its family file. Host-side argument parsing
(:func:`ints`, :func:`floats`, :func:`norm_axis`, :func:`prod`, :func:`scalar_of`) and the
choice of the dtype an op computes in (:func:`compute_dtype`, :func:`widen_half`,
:func:`work_dtype`), like :func:`ensure_array`, :func:`quiet` and :func:`stable_argsort`, work for
numpy and cupy arrays alike.

>>> ints(np.array([2, -1])), floats(2), prod([2, 3]), norm_axis(-1, 3, "Gather")
([2, -1], [2.0], 6, 2)
"""

from __future__ import annotations

import numpy as np  # dtype constants, np.errstate and np.generic only

from workbench.errors import ShapeError

# ----------------------------------------------------------------------------------------------
# host-side arguments


def _host_list(values, cast) -> list:
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (int, float)):
        return [cast(values)]
    return [cast(v) for v in values]


def ints(values) -> list[int]:
    """A host list of Python ints from an int tensor, a list or a scalar (None -> [])."""
    return _host_list(values, int)


def floats(values) -> list[float]:
    """A host list of Python floats from a tensor, a list or a scalar (None -> [])."""
    return _host_list(values, float)


def norm_axis(axis: int, rank: int, op: str, what: str = "axis") -> int:
    """``axis`` in [0, rank); a ShapeError naming ``op`` and ``what`` outside [-rank, rank)."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: {what} {axis} is out of range for an input of rank {rank} "
                         f"(accepted range is [{-rank}, {rank - 1}])")
    return axis % rank


def prod(values) -> int:
    """The product of ``values`` (a shape) as a Python int; 1 for no values."""
    out = 1
    for v in values:
        out *= int(v)
    return out


def scalar_of(op: str, name: str, x):
    """The single element of tensor ``x`` (a numpy scalar, or a 0-d array on cupy); a
    ShapeError naming ``op`` and the input ``name`` when ``x`` does not hold exactly one."""
    if x.size != 1:
        raise ShapeError(f"{op}: {name} must be a scalar, got shape {tuple(x.shape)}")
    return x.reshape(-1)[0]


# ----------------------------------------------------------------------------------------------
# array results and numpy warnings


def ensure_array(r, xp=np):
    """numpy ufuncs return scalars for 0-d inputs: turn them back into 0-d arrays."""
    return xp.asarray(r) if isinstance(r, np.generic) else r


def quiet():
    """Silence numpy floating-point warnings (division by zero, overflow, NaN) in a block."""
    return np.errstate(all="ignore")


def stable_argsort(xp, a, axis=-1):
    """A stable argsort along ``axis`` for numpy and cupy."""
    # cupy's argsort is always stable (and older versions take no ``kind``)
    if xp is np:
        return np.argsort(a, axis=axis, kind="stable")
    return xp.argsort(a, axis=axis)


# ----------------------------------------------------------------------------------------------
# compute dtypes


def is_float(dtype) -> bool:
    """True for float16/32/64 and the ml_dtypes floats (bfloat16, float8...)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or (dtype.kind == "V" and "float" in dtype.name)


def compute_dtype(dtype):
    """The half-precision policy, in one place: the dtype to compute a float op in is float32
    for float16/bfloat16 (and the narrower ml_dtypes floats), else the dtype itself."""
    dtype = np.dtype(dtype)
    if dtype.itemsize < 4 and is_float(dtype):
        return np.dtype(np.float32)
    return dtype


def to_compute(x):
    """``x`` in its compute dtype (:func:`compute_dtype`; other dtypes unchanged)."""
    cd = compute_dtype(x.dtype)
    return x if x.dtype == cd else x.astype(cd)


def widen_half(x):
    """``x`` as float32 (a new array) when it is float16 or bfloat16, else ``x`` itself: the
    precision to accumulate half floats in."""
    return x.astype(np.float32) if x.dtype.name in ("float16", "bfloat16") else x


def work_dtype(dtype) -> np.dtype:
    """float64 for float64, float32 for every other dtype (the precision of ops that compute in
    single or double precision only)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)
