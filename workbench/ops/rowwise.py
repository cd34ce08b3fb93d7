"""Calls into the compiled transformer kernels (``workbench/compiled/kernels/transformer.py``):
LayerNorm (plain, RMS, with skip/bias), softmax (with attention's scale and masks) and GELU
(erf, tanh; bias and residual fused) over the last axis of float32 host arrays.

Each function returns its result, or None when the compiled kernel is not loaded or the
arguments are outside what it does (another dtype, a device array, a broadcast it does not
take): the caller then runs its numpy path, which stays the reference. Work is split by rows
over the engine's threads (``run_blocks``) when it is large enough. The kernels are called
through their bare ctypes entry (``Kernel.raw``) with the checks made here: on a [32, 64]
LayerNorm the checked call costs more than the kernel. Shapes and flags go packed in one
int64 array, made once per distinct set of values (:func:`_packed`): a call passes only
data pointers, the row range and the float scalars.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from workbench import compiled
from workbench.compiled import data_pointer
from workbench.ops.parallel import n_workers, run_blocks

_F32 = np.dtype(np.float32)
_DUMMY = np.zeros(1, np.float32)
_DUMMY_U8 = np.zeros(1, np.uint8)
_BLOCK = 1 << 15          # elements per job when the rows are split over threads
_PARALLEL_MIN = 1 << 17   # elements under which one call on this thread does it

#: GELU-type epilogues of :func:`gelu`: name -> the kernel's activation code
ACTIVATIONS = {"": 0, "Gelu": 1, "GeluTanh": 2, "Relu": 3}


def _kernel(name):
    k = compiled.kernel("transformer." + name)
    return None if k is None else k.raw


def is_f32(a) -> bool:
    """A float32 numpy array (host)."""
    return type(a) is np.ndarray and a.dtype == _F32


def _c(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _vector(p, n):
    """``p`` as a contiguous float32 (n,) array when it is one (any leading 1s), else None."""
    if p is None or not is_f32(p) or p.size != n or (p.ndim and p.shape[-1] != n):
        return None
    return _c(p).reshape(n)


_PACKED: dict = {}        # int64 parameter arrays of the kernels, by their values
_PACKED_MAX = 1024


def _packed(values: tuple):
    """The kernels' packed int64 parameters ``values`` as an array, made once per distinct
    tuple (a model's calls repeat a few shapes). The caller holds the array (not only its
    address) until its kernel call returns: another thread may clear the table meanwhile."""
    p = _PACKED.get(values)
    if p is None:
        if len(_PACKED) >= _PACKED_MAX:
            _PACKED.clear()
        p = _PACKED[values] = np.array(values, np.int64)
    return p


def _run(call, rows, n, cost=1):
    """``call(r0, r1)`` over the rows, split over the worker threads when large."""
    if rows * n * cost < _PARALLEL_MIN or n_workers() == 1 or rows < 2:
        call(0, rows)
        return
    step = max(1, min(_BLOCK // max(1, n), -(-rows // (2 * n_workers()))))
    jobs = [(r, min(rows, r + step)) for r in range(0, rows, step)]

    def work(chunk):
        for r0, r1 in chunk:
            call(r0, r1)
    run_blocks(np, jobs, work, rows * n * cost)


# ------------------------------------------------------------------------------ LayerNorm
def layer_norm(x, gamma, beta, eps, *, skip=None, bias=None, simplified=False,
               want_sum=False):
    """LayerNorm over the last axis of ``x + skip + bias`` (``simplified``: the RMS form,
    ``beta`` ignored); returns y, or (y, sum) with ``want_sum``; None when not compiled here.
    ``skip`` may have x's shape, x's last two dimensions, or be one row."""
    raw = _kernel("layer_norm")
    if raw is None or not is_f32(x) or x.ndim == 0 or x.shape[-1] == 0:
        return None
    n = int(x.shape[-1])
    rows = x.size // n
    if gamma is None or gamma.ndim > x.ndim or (beta is not None and beta.ndim > x.ndim):
        return None     # a result of higher rank than x: numpy's broadcasting
    g = _vector(gamma, n)
    b = None if beta is None or simplified else _vector(beta, n)
    bs = None if bias is None else _vector(bias, n)
    if g is None or (beta is not None and not simplified and b is None) or \
            (bias is not None and bs is None):
        return None
    sk, skip_rows = None, 1
    if skip is not None:
        if not is_f32(skip):
            return None
        if skip.shape == x.shape:
            skip_rows = rows
        elif skip.size == n and skip.shape[-1] == n:
            skip_rows = 1
        elif x.ndim >= 2 and skip.ndim >= 2 and skip.shape[-2:] == x.shape[-2:] \
                and skip.size == n * x.shape[-2]:
            skip_rows = int(x.shape[-2])
        else:
            return None
        sk = _c(skip)
    y = np.empty(x.shape, _F32)
    s = np.empty(x.shape, _F32) if want_sum else None
    _layer_norm_call(raw, _c(x), y, s, g, b, sk, skip_rows, bs, simplified, rows, n, eps)
    return (y, s) if want_sum else y


def _layer_norm_call(raw, xc, y, s, g, b, sk, skip_rows, bs, simplified, rows, n, eps):
    """The LayerNorm kernel over checked arguments (:func:`layer_norm`)."""
    if rows:
        p = _packed((rows, n, skip_rows, int(sk is not None), int(bs is not None),
                     int(b is not None), int(simplified), int(s is not None)))
        args = (data_pointer(xc), data_pointer(_DUMMY if sk is None else sk),
                data_pointer(_DUMMY if bs is None else bs), data_pointer(g),
                data_pointer(_DUMMY if b is None else b), data_pointer(y),
                data_pointer(_DUMMY if s is None else s), data_pointer(p))
        e = float(eps)
        if rows * n * 4 < _PARALLEL_MIN:
            raw(*args, 0, rows, e)
        else:
            _run(lambda r0, r1: raw(*args, r0, r1, e), rows, n, 4)


def layer_norm_rows(x, gamma, beta, eps):
    """:func:`layer_norm` of a float32 C-contiguous ``x`` with ``gamma`` and ``beta`` (or
    None) float32 C-contiguous (n,) rows, as the caller has checked: the same kernel call
    without the checks (FusedMatMul's epilogue on its own fresh product). None when the kernel
    is not loaded."""
    raw = _kernel("layer_norm")
    if raw is None:
        return None
    n = x.shape[-1]
    y = np.empty(x.shape, _F32)
    _layer_norm_call(raw, x, y, None, gamma, beta, None, 1, None, False, x.size // n, n, eps)
    return y


def bind_layer_norm(extra, key, x, gamma, beta, eps) -> None:
    """After a LayerNormalization node's run of :func:`layer_norm` (no skip/bias/sum): on
    the second run with the same arrays (gamma and beta the same objects, x of the same
    shape) keep in ``extra[key]`` a pre-bound call ``(x, gamma, beta) -> y or None``: the
    same kernel with the same arguments, packed once in an int64 block that
    ``gemm_avx2.fused_block`` (a product of no rows, then this kernel called from C) takes as
    its one ctypes argument, instead of eleven (~0.4 us each); through
    ``gemm_avx2.checked_block``, which reads x's and y's data pointers from the array objects
    (Python hands it their ``id``). It answers None (the caller's
    full path runs) when an input differs or kernels are off. Not bound: rows the full path
    splits over the pool, or the C module not loaded."""
    seen = (x.shape, id(gamma), id(beta), eps)
    if extra.get(key + "_seen") != seen:
        extra[key + "_seen"] = seen
        extra.pop(key, None)
        return
    if key in extra:
        return
    import ctypes

    raw, blk_k = _kernel("layer_norm"), compiled.kernel("gemm_avx2.fused_block")
    n = int(x.shape[-1]) if x.ndim else 0
    if raw is None or blk_k is None or not is_f32(x) or not n or not x.flags.c_contiguous \
            or gamma.ndim > x.ndim or (beta is not None and beta.ndim > x.ndim):
        return    # (a gamma of higher rank than x: layer_norm leaves it to numpy)
    rows = x.size // n
    g, b = _vector(gamma, n), None if beta is None else _vector(beta, n)
    if g is None or (beta is not None and b is None) or rows * n * 4 >= _PARALLEL_MIN:
        return
    p = np.array((rows, n, 1, 0, 0, int(b is not None), 0, 0), np.int64)
    chk, off = compiled.kernel("gemm_avx2.checked_block"), compiled.data_pointer_offset()
    blk = np.zeros(46, np.int64)   # fused_block's slots: no product (rows 0..0), no GELU
    blk[20:32] = (ctypes.cast(raw, ctypes.c_void_p).value, 0, data_pointer(_DUMMY),
                  data_pointer(_DUMMY), data_pointer(g),
                  data_pointer(_DUMMY if b is None else b), 0, data_pointer(_DUMMY),
                  data_pointer(p), 0, rows,
                  int(np.array(float(eps)).view(np.int64)))
    # checked_block (nothing to compare: no weights sampled, no bias) reads the data
    # pointers of x and y from the objects into slots 21 and 26 (slot 0 gets _DUMMY's)
    blk[39:46] = (0 if off is None else off, id(_DUMMY), 0, 0, 21, 26, -1)
    view = (ctypes.c_int64 * 46).from_buffer(blk)
    call = (blk_k if chk is None or off is None else chk).raw
    by_id = call is not blk_k.raw
    addr = data_pointer(blk)
    shape, strides, on, empty = x.shape, x.strides, compiled._ENABLED, np.empty
    busy = threading.Lock()   # the block is shared: a second thread takes the full path

    def bound(x_, gamma_, beta_, _keep=(g, b, p, blk)):
        if gamma_ is not gamma or beta_ is not beta or type(x_) is not np.ndarray \
                or x_.dtype is not _F32 or x_.shape != shape \
                or (x_.strides != strides and not x_.flags.c_contiguous) \
                or not (on and on[0]) or not busy.acquire(False):
            return None
        try:
            y = empty(shape, _F32)
            if by_id:
                view[41], view[42] = id(x_), id(y)
            else:
                view[21], view[26] = data_pointer(x_), data_pointer(y)
            call(addr)
            return y
        finally:
            busy.release()
    extra[key] = bound


# ------------------------------------------------------------------------------ softmax
def _mask_strides(m, shape):
    """Element strides (a, b, c, j) of a C-contiguous mask ``m`` (an array, or its shape)
    broadcast to ``shape`` seen as (A, Bd, C, n); None when it does not broadcast or its
    leading dimensions do not merge."""
    nd, ms = len(shape), getattr(m, "shape", m)
    if len(ms) > nd:
        return None
    st, step = [0] * nd, 1          # 0 where m is broadcast
    for i in range(1, len(ms) + 1):
        d = ms[-i]
        if d != 1:
            if d != shape[-i]:
                return None
            st[-i] = step
            step *= d
    if nd == 4:
        return shape, st
    dims = list(shape)
    if nd < 4:
        return [1] * (4 - nd) + dims, [0] * (4 - nd) + st
    while len(dims) > 4:   # merge the two leading dims where the strides allow it
        if dims[0] == 1:
            d, s0 = dims[1], st[1]
        elif dims[1] == 1:
            d, s0 = dims[0], st[0]
        elif st[0] == st[1] * dims[1]:
            d, s0 = dims[0] * dims[1], st[1]
        else:
            return None
        dims[:2], st[:2] = [d], [s0]
    return dims, st


def _grid(shape):
    if len(shape) == 4:
        return shape
    dims = [int(d) for d in shape]
    while len(dims) < 4:
        dims.insert(0, 1)
    while len(dims) > 4:
        dims[:2] = [dims[0] * dims[1]]
    return dims



def _target(x, out):
    """``(y, xc)``: the array to write and the input to pass (``_DUMMY`` when writing in
    place, ``out is x``, which needs a writeable C-contiguous x), or None."""
    if out is x:
        if not x.flags.c_contiguous or not x.flags.writeable:
            return None
        return x, _DUMMY
    return (np.empty(x.shape, _F32) if out is None else out), _c(x)

def softmax(x, *, out=None, scale=None, divide=False, add=None, fill_where=None,
            fill=0.0, zero_empty_rows=False):
    """Softmax over the last axis of ``t``, where ``t = x * scale`` (``/ scale`` with
    ``divide``), ``+ add`` (an additive mask broadcast to x), then ``fill`` where the boolean
    ``fill_where`` (broadcast to x) is true. ``out``: the array to write (``out is x``: in
    place; x must then be C-contiguous); ``zero_empty_rows``: a row of only -inf gives zeros
    (not NaN). None when not compiled here."""
    raw = _kernel("softmax")
    if raw is None or not is_f32(x) or x.ndim == 0 or x.shape[-1] == 0:
        return None
    shape = x.shape
    n = int(shape[-1])
    rows = x.size // n
    madd = mfill = None
    sa = sf = (0, 0, 0, 0)
    if add is not None:
        if not is_f32(add):
            return None
        madd = _c(add)
        g = _mask_strides(madd, shape)
        if g is None:
            return None
        sa = g[1]
    if fill_where is not None:
        if type(fill_where) is not np.ndarray or fill_where.dtype != np.bool_:
            return None
        mfill = _c(fill_where).view(np.uint8)
        g = _mask_strides(mfill, shape)
        if g is None:
            return None
        sf = g[1]
    _, Bd, C, _ = _grid(shape)
    in_place = out is x
    t = _target(x, out)
    if t is None:
        return None
    y, xc = t
    if rows:
        mode = 0 if scale is None else (2 if divide else 1)
        p = _packed((rows, n, C, Bd, sa[0], sa[1], sa[2], sa[3], sf[0], sf[1], sf[2], sf[3],
                     1 if madd is None else madd.size, 1 if mfill is None else mfill.size,
                     int(not in_place), mode, int(madd is not None), int(mfill is not None),
                     int(bool(zero_empty_rows))))
        args = (data_pointer(xc), data_pointer(y),
                data_pointer(_DUMMY if madd is None else madd),
                data_pointer(_DUMMY_U8 if mfill is None else mfill), data_pointer(p))
        sc, fl = float(1.0 if scale is None else scale), float(fill)
        if rows * n * 8 < _PARALLEL_MIN:
            raw(*args, 0, rows, sc, fl)
        else:
            _run(lambda r0, r1: raw(*args, r0, r1, sc, fl), rows, n, 8)
    return y


def softmax_kernel():
    """The compiled softmax's bare entry (for :func:`softmax_call`), or None."""
    return _kernel("softmax")


def softmax_params(shape, mask_shape, additive, divide, scaled):
    """The packed parameters of an in-place :func:`softmax` of a C-contiguous float32 array of
    ``shape`` (no empty rows) with a C-contiguous mask of ``mask_shape`` (None: no mask; an
    ``additive`` float32 mask, else a boolean fill mask), scaled (``scaled``: by a factor,
    ``divide``: by its inverse): what :func:`softmax` packs for that call, made once for a
    caller that keeps it (:func:`softmax_call`). False when :func:`softmax` would not take it."""
    n = int(shape[-1])
    rows = math.prod(shape) // n if n else 0
    if not rows:
        return False
    sa = sf = (0, 0, 0, 0)
    size = 1
    if mask_shape is not None:
        g = _mask_strides(mask_shape, shape)
        if g is None:
            return False
        size = math.prod(mask_shape)
        if additive:
            sa = g[1]
        else:
            sf = g[1]
    _, Bd, C, _ = _grid(shape)
    mode = 0 if not scaled else (2 if divide else 1)
    has_add = mask_shape is not None and additive
    has_fill = mask_shape is not None and not additive
    return (np.array((rows, n, C, Bd, sa[0], sa[1], sa[2], sa[3], sf[0], sf[1], sf[2], sf[3],
                      size if has_add else 1, size if has_fill else 1, 0, mode, int(has_add),
                      int(has_fill), 0), np.int64), rows, n)


def softmax_call(raw, y, params, madd, mfill, scale, fill) -> None:
    """The softmax kernel ``raw`` (:func:`softmax_kernel`) in place on ``y`` with the
    parameters of :func:`softmax_params` for y's shape and the masks' (``madd`` float32 /
    ``mfill`` uint8, C-contiguous, or None as when packed): the call :func:`softmax` makes."""
    p, rows, n = params
    args = (data_pointer(_DUMMY), data_pointer(y),
            data_pointer(_DUMMY if madd is None else madd),
            data_pointer(_DUMMY_U8 if mfill is None else mfill), data_pointer(p))
    sc, fl = float(1.0 if scale is None else scale), float(fill)
    if rows * n * 8 < _PARALLEL_MIN:
        raw(*args, 0, rows, sc, fl)
    else:
        _run(lambda r0, r1: raw(*args, r0, r1, sc, fl), rows, n, 8)


# ------------------------------------------------------------------------------ GELU
def gelu(x, activation, *, bias=None, residual=None, out=None):
    """``activation(x + bias) + residual`` over the last axis (activation a key of
    :data:`ACTIVATIONS`); ``out is x`` works in place (x C-contiguous and writeable).
    ``bias``: one row; ``residual``: x's shape. None when not compiled here."""
    raw = _kernel("gelu")
    act = ACTIVATIONS.get(activation)
    if raw is None or act is None or not is_f32(x) or x.ndim == 0:
        return None
    n = int(x.shape[-1]) if x.ndim else 1
    rows = x.size // n if n else 0
    b = None
    if bias is not None:
        b = _vector(bias, n)
        if b is None:
            return None
    z = None
    if residual is not None:
        if not is_f32(residual) or residual.shape != x.shape or residual is x \
                or residual is out:
            return None
        z = _c(residual)
    in_place = out is x
    t = _target(x, out)
    if t is None:
        return None
    y, xc = t
    _gelu_call(raw, xc, y, b, z, act, in_place, rows, n)
    return y


def gelu_rows_inplace(y, act, b, z) -> bool:
    """:func:`gelu` in place on the float32 C-contiguous ``y`` (activation code ``act`` of
    :data:`ACTIVATIONS`), ``b`` None or a float32 C-contiguous (n,) row, ``z`` None or a
    float32 C-contiguous array of y's shape (not y), as the caller has checked: the same kernel
    call without the checks. False when the kernel is not loaded (y untouched)."""
    raw = _kernel("gelu")
    if raw is None:
        return False
    n = y.shape[-1]
    _gelu_call(raw, _DUMMY, y, b, z, act, True, y.size // n if n else 0, n)
    return True


def _gelu_call(raw, xc, y, b, z, act, in_place, rows, n):
    """The GELU kernel over checked arguments (:func:`gelu`)."""
    if rows:
        p = _packed((rows, n, int(not in_place), int(b is not None), int(z is not None), act))
        args = (data_pointer(xc), data_pointer(y), data_pointer(_DUMMY if b is None else b),
                data_pointer(_DUMMY if z is None else z), data_pointer(p))
        # element-operations per value, against the thread pool's dispatch (~30-50 us):
        # the erf GELU runs at ~1.2 ns a value here, the tanh form ~3 ns
        cost = 2 if act == 1 else 4 if act == 2 else 1
        if rows * n * cost < _PARALLEL_MIN:
            raw(*args, 0, rows)
        else:
            _run(lambda r0, r1: raw(*args, r0, r1), rows, n, cost)
