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

import math

import numpy as np  # dtype constants, np.errstate and np.generic only

from workbench.errors import ShapeError
from workbench.limits import check_alloc

# outputs up to this many bytes are never checked against the memory budget (fast path)
_UNCHECKED_BYTES = 1 << 24

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


def check_broadcast(op: str, *arrays) -> None:
    """Refuse (ResourceError) a broadcast whose result would exceed the memory budget, before
    numpy allocates it (``[N, 1] * [1, N]`` is N**2 elements). Cheap when shapes are equal."""
    shapes = []
    for a in arrays:
        if a is not None and hasattr(a, "shape"):
            shapes.append(a.shape)
    if len(shapes) < 2:
        return
    first = shapes[0]
    for s in shapes:
        if s != first:
            break
    else:
        return
    itemsize = max(getattr(getattr(arrays[0], "dtype", None), "itemsize", 8), 1)
    bound = itemsize
    for s in shapes:   # each output dimension is one of the inputs': at most their product
        bound *= math.prod(s)
    if bound <= _UNCHECKED_BYTES:
        return
    nd = max(len(s) for s in shapes)
    size = 1
    out = []
    for i in range(1, nd + 1):
        d = 1
        for s in shapes:
            if len(s) >= i and s[-i] != 1:
                d = s[-i]
        out.append(d)
        size *= d
    if size * itemsize > _UNCHECKED_BYTES:
        check_alloc(out[::-1], itemsize=itemsize, what=f"{op}: the broadcast output")


def check_matmul(op: str, a_shape, b_shape, itemsize: int = 4) -> None:
    """Refuse a (batched) matrix product whose output would exceed the memory budget."""
    if len(a_shape) < 1 or len(b_shape) < 1:
        return
    m = a_shape[-2] if len(a_shape) >= 2 else 1
    n = b_shape[-1] if len(b_shape) >= 2 else 1
    batch = 1
    ba, bb = tuple(a_shape[:-2]), tuple(b_shape[:-2])
    for i in range(1, max(len(ba), len(bb)) + 1):
        da = ba[-i] if len(ba) >= i else 1
        db = bb[-i] if len(bb) >= i else 1
        batch *= max(da, db)
    if batch * m * n * itemsize > _UNCHECKED_BYTES:
        check_alloc((batch, m, n), itemsize=itemsize, what=f"{op}: the output")


def stable_sigmoid(xp, x):
    """1 / (1 + exp(-x)) from exp(-|x|): never overflows, no warnings, exact limits; a new
    array of x's (floating) dtype."""
    e = xp.exp(-xp.abs(x))
    r = 1 / (1 + e)
    return xp.where(x >= 0, r, e * r)


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
    dt = x.dtype   # (``dtype.name`` is Python code in numpy: asked only of 2-byte dtypes)
    return x.astype(np.float32) if dt.itemsize == 2 and dt.name in ("float16", "bfloat16") else x


def work_dtype(dtype) -> np.dtype:
    """float64 for float64, float32 for every other dtype (the precision of ops that compute in
    single or double precision only)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


# ----------------------------------------------------------------------------------------------
# the softmax


def softmax(xp, x, axis: int = -1, *, log: bool = False, dtype=None, overwrite: bool = False,
            zero_empty_rows: bool = False, dead=None):
    """The engine's one softmax (``log=True``: log-softmax) of ``x`` along ``axis``:
    ``exp(x - max) / sum``, computed in ``dtype`` (default: :func:`compute_dtype` of ``x``,
    float32 for half floats) and returned in it.

    Used by Softmax/LogSoftmax, every attention kernel and the ML post-transforms. A row whose
    entries are all ``-inf`` gives NaN, as ONNX's Softmax says; with ``zero_empty_rows`` it
    gives zeros (nothing to attend to), as do the rows flagged in ``dead`` (a boolean array
    broadcastable to the result, e.g. rows whose additive mask is all ``-inf``).
    ``overwrite=True``: ``x`` is the caller's own array, already in ``dtype``, and is computed
    in place. Floating-point warnings are silenced (``-inf`` rows are expected).
    """
    dt = compute_dtype(x.dtype) if dtype is None else np.dtype(dtype)
    xc = x if overwrite and x.dtype == dt else x.astype(dt, copy=False)
    if xc.size == 0:
        return xc if xc is not x else xc.copy()
    with quiet():
        m = xp.max(xc, axis=axis, keepdims=True)
        if zero_empty_rows:
            empty = m == -np.inf
            m = xp.where(empty, xp.zeros((), dtype=dt), m)
            if dead is not None:
                empty = empty | dead
        else:
            empty = dead
        t = xp.subtract(xc, m, out=xc) if overwrite and xc is x else xc - m
        if log:
            t -= xp.log(xp.exp(t).sum(axis=axis, keepdims=True))
        else:
            xp.exp(t, out=t)
            t /= t.sum(axis=axis, keepdims=True)
        if empty is not None:
            t = xp.where(empty, xp.zeros((), dtype=dt), t)
    return t
