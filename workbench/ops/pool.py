"""Pooling: MaxPool, AveragePool, LpPool, their Global forms, MaxUnpool, MaxRoiPool, RoiAlign.

The windowed pools reduce one spatial axis at a time (max and sum are separable): along an
axis each kernel tap is one strided ``maximum``/``add`` over the outputs where it falls inside
the input, on cache-sized blocks of (image, channels), spread over threads. Windows are clipped
at the borders instead of padding the input (same result, no padded copy); there are no Python
loops over pixels. The output size follows the spec (floor or ``ceil_mode``; with ``ceil_mode``
a window that would start in the end padding is dropped, and the positions that ceil mode adds
past ``pads`` count neither as input nor as padding).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from workbench import compiled
from workbench.arrays import xp_of
from workbench.arrays.geometry import window_geometry
from workbench.errors import InputError, ShapeError
from workbench.ops._common import compute_dtype, to_compute
from workbench.ops.parallel import blocks, call_blocks, n_workers, run_blocks
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.windows import (
    pad_spatial,
    spatial_ints,
    tap_view,
)


class PoolWindow(NamedTuple):
    """A pooling node's window per spatial axis: kernel size ``ks``, strides ``st``,
    dilations ``dl``, pads at the beginning ``pb`` and end ``pe``, output size ``out``, and the
    ``extra`` end padding ceil mode adds (``arrays.geometry.window_geometry``)."""
    ks: list
    st: list
    dl: list
    pb: list
    pe: list
    out: list
    extra: list


def _pool_setup(op, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode) -> PoolWindow:
    if X.ndim < 3:
        raise ShapeError(f"{op}: input X must have shape (N, C, D1, ...) with at least one "
                         f"spatial axis, got shape {tuple(X.shape)}")
    nd = X.ndim - 2
    if kernel_shape is None or len(kernel_shape) != nd:
        raise ShapeError(f"{op}: attribute kernel_shape={kernel_shape} must give one size per "
                         f"spatial axis ({nd} for input shape {tuple(X.shape)})")
    ks = [int(k) for k in kernel_shape]
    st = spatial_ints(op, "strides", strides, nd, 1)
    dl = spatial_ints(op, "dilations", dilations, nd, 1)
    pb, pe, out, extra = window_geometry(op, X.shape[2:], ks, st, dl, pads, auto_pad,
                                         ceil_mode=bool(ceil_mode))
    return PoolWindow(ks, st, dl, pb, pe, out, extra)


def _lowest(dtype):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return -np.inf
    if dt.kind == "b":
        return False
    return np.iinfo(dt).min


_POOL_BLOCK = 1 << 17  # input elements per block (input, one intermediate and output in L2)


def _window_reduce(x, ks, st, dl, pb, out, reduce, channels_last=False):
    """Max or sum over every window, one spatial axis at a time (both are separable).

    Windows are clipped at the input borders, which is the same as padding with the
    reduction's identity (-inf / 0) but needs no padded copy. Along each axis every kernel tap
    is one strided ``maximum``/``add`` over the output range where it lands inside the input;
    blocks of (image, channels) keep the intermediate results in cache. ``channels_last``:
    ``x`` is (N, *spatial, C) (the layout pass' NHWC), and so is the result.
    """
    xp = xp_of(x)
    nd = len(ks)
    if channels_last:
        N, C = x.shape[0], x.shape[-1]
        ax0 = 1
        y = xp.empty((N,) + tuple(out) + (C,), dtype=x.dtype)
    else:
        N, C = x.shape[:2]
        ax0 = 2
        y = xp.empty((N, C) + tuple(out), dtype=x.dtype)
    ufunc = xp.maximum if reduce == "max" else xp.add
    identity = _lowest(x.dtype) if reduce == "max" else 0
    plans = []
    for a in range(nd):
        size = int(x.shape[ax0 + a])
        taps = []
        for t in range(ks[a]):
            off = t * dl[a] - pb[a]
            lo = max(0, -(off // st[a]))  # first output whose tap index is >= 0
            hi = min(out[a], (size - 1 - off) // st[a] + 1) if size - 1 - off >= 0 else 0
            if hi > lo:
                taps.append((lo, hi, off))
        full = [tp for tp in taps if tp[0] == 0 and tp[1] == out[a]]
        first = full[0] if full else None
        plans.append((first, [tp for tp in taps if tp is not first]))

    def along(src, dst, a):
        full, rest = plans[a]
        pre = (slice(None),) * (ax0 + a)
        s_ = st[a]
        if full is None:
            dst.fill(identity)
        else:
            lo, hi, off = full
            xp.copyto(dst, src[pre + (slice(lo * s_ + off, (hi - 1) * s_ + off + 1, s_),)])
        for lo, hi, off in rest:
            d = dst[pre + (slice(lo, hi),)]
            ufunc(d, src[pre + (slice(lo * s_ + off, (hi - 1) * s_ + off + 1, s_),)], out=d)

    def block(a, bn, bc):
        return a[bn, ..., bc] if channels_last else a[bn, bc]

    def work(chunk):
        for bn, bc in chunk:
            cur = block(x, bn, bc)
            for a in range(nd):  # outermost axis first: its taps read contiguous rows
                if a == nd - 1:
                    dst = block(y, bn, bc)
                else:
                    shape = list(cur.shape)
                    shape[ax0 + a] = out[a]
                    dst = xp.empty(shape, dtype=x.dtype)
                along(cur, dst, a)
                cur = dst
    per_channel = int(math.prod(x.shape[ax0:ax0 + nd]))
    if channels_last and xp is np:
        # whole images (all channels: the contiguous inner run); a channel block would cut
        # each pixel's channels into short strided runs
        nb = max(1, _POOL_BLOCK // max(1, C * per_channel))
        jobs = [(slice(n, min(N, n + nb)), slice(None)) for n in range(0, N, nb)]
    else:
        jobs = blocks(xp, N, C, per_channel, _POOL_BLOCK)
    run_blocks(xp, jobs, work, N * C * per_channel * max(ks))
    return y


def _axis_counts(op, S, pb, pe, ks, st, dl, out, include_pad):
    """Per-axis number of taps of each output window that count for the average."""
    counts = []
    for s_, b, e, k, s, d, o in zip(S, pb, pe, ks, st, dl, out):
        lo, hi = (0, s_ + b + e) if include_pad else (b, b + s_)
        counts.append([sum(1 for t in range(k) if lo <= i * s + t * d < hi) for i in range(o)])
    return counts


# --------------------------------------------------------------------------------------------
# MaxPool
# --------------------------------------------------------------------------------------------

@kernel("MaxPool", since=1, wants_ctx=True, category="pooling")
def max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
             pads=None, storage_order=0, strides=None, ctx=None):
    """ONNX MaxPool (all versions): max over each window; optional Indices (opset 8+)."""
    ks, st, dl, pb, pe, out, extra = _pool_setup("MaxPool", X, kernel_shape, strides,
                                                 dilations, pads, auto_pad, ceil_mode)
    want_idx = ctx is not None and ctx.n_outputs > 1
    x = X if X.dtype.kind in "iub" else to_compute(X)
    pe_all = [e + x_ for e, x_ in zip(pe, extra)]
    if want_idx:
        y, idx = _max_pool_with_indices(x, ks, st, dl, pb, pe_all, out, int(storage_order))
        return y.astype(X.dtype, copy=False), idx
    y = _window_reduce(x, ks, st, dl, pb, out, "max")
    return y.astype(X.dtype, copy=False)


def _max_pool_with_indices(x, ks, st, dl, pb, pe_all, out, storage_order):
    xp = xp_of(x)
    N, C = x.shape[:2]
    S = [int(v) for v in x.shape[2:]]
    nd = len(S)
    xpad = pad_spatial(x, pb, pe_all, _lowest(x.dtype))
    taps = list(itertools.product(*[range(k) for k in ks]))
    best = xp.zeros((N, C) + tuple(out), dtype=xp.int32)
    y = xp.array(tap_view(xpad, taps[0], st, dl, out), copy=True)
    for t in range(1, len(taps)):
        v = tap_view(xpad, taps[t], st, dl, out)
        better = v > y
        xp.copyto(y, v, where=better)
        xp.copyto(best, t, where=better)
    # flat index into the (unpadded) input: batch/channel row-major, spatial per storage_order
    if storage_order:
        mult = [int(math.prod(S[:a])) for a in range(nd)]
    else:
        mult = [int(math.prod(S[a + 1:])) for a in range(nd)]
    plane = int(math.prod(S))
    idx = (xp.arange(N * C, dtype=xp.int64) * plane).reshape((N, C) + (1,) * nd)
    for a in range(nd):
        tapc = xp.asarray([tp[a] for tp in taps], dtype=xp.int64)
        shape = [1] * (2 + nd)
        shape[2 + a] = out[a]
        o = xp.arange(out[a], dtype=xp.int64).reshape(shape)
        pos = o * st[a] - pb[a] + tapc[best] * dl[a]
        idx = idx + pos * mult[a]
    return y, idx


@kernel("GlobalMaxPool", since=1, category="pooling")
def global_max_pool(X):
    """Max over all spatial axes, kept as size-1 axes."""
    if X.ndim < 3:
        raise ShapeError(f"GlobalMaxPool: input must be (N, C, D1, ...), got {tuple(X.shape)}")
    x = X if X.dtype.kind in "iub" else to_compute(X)
    axes = tuple(range(2, X.ndim))
    return x.max(axis=axes, keepdims=True).astype(X.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# AveragePool, LpPool
# --------------------------------------------------------------------------------------------

@kernel("AveragePool", since=1, category="pooling")
def average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    """ONNX AveragePool (all versions): window sums divided by the counted taps."""
    op = "AveragePool"
    ks, st, dl, pb, pe, out, extra = _pool_setup(op, X, kernel_shape, strides, dilations,
                                                 pads, auto_pad, ceil_mode)
    xp = xp_of(X)
    N, C = X.shape[:2]
    if N * C == 0:
        return xp.empty((N, C) + tuple(out), dtype=X.dtype)
    x = to_compute(X)
    acc = _window_reduce(x, ks, st, dl, pb, out, "sum")
    counts = _axis_counts(op, X.shape[2:], pb, pe, ks, st, dl, out, bool(count_include_pad))
    nd = len(out)
    inv = None
    for a, c in enumerate(counts):
        shape = [1] * nd
        shape[a] = len(c)
        ca = xp.asarray([1.0 / max(v, 1) for v in c], dtype=x.dtype).reshape(shape)
        inv = ca if inv is None else inv * ca
    acc *= inv
    return acc.astype(X.dtype, copy=False)


def _lp_pool(X, p, ks, st, dl, pb, pe, extra, out):
    xp = xp_of(X)
    N, C = X.shape[:2]
    if N * C == 0:
        return xp.empty((N, C) + tuple(out), dtype=X.dtype)
    x = to_compute(X)
    p = float(p)
    xa = x * x if p == 2.0 else xp.abs(x) if p == 1.0 else xp.abs(x) ** p
    s = _window_reduce(xa, ks, st, dl, pb, out, "sum")
    y = xp.sqrt(s) if p == 2.0 else s if p == 1.0 else s ** (1.0 / p)
    return y.astype(X.dtype, copy=False)


@kernel("LpPool", since=1, category="pooling")
def lp_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    """ONNX LpPool (all versions; p is a float at opset 1): (sum |x|^p)^(1/p) per window."""
    ks, st, dl, pb, pe, out, extra = _pool_setup("LpPool", X, kernel_shape, strides, dilations,
                                                 pads, auto_pad, ceil_mode)
    return _lp_pool(X, p, ks, st, dl, pb, pe, extra, out)


@kernel("GlobalAveragePool", since=1, category="pooling")
def global_average_pool(X):
    """Mean over all spatial axes, kept as size-1 axes."""
    if X.ndim < 3:
        raise ShapeError(f"GlobalAveragePool: input must be (N, C, D1, ...), got "
                         f"{tuple(X.shape)}")
    axes = tuple(range(2, X.ndim))
    cd = compute_dtype(X.dtype)
    return X.mean(axis=axes, keepdims=True, dtype=cd).astype(X.dtype, copy=False)


@kernel("GlobalLpPool", since=1, category="pooling")
def global_lp_pool(X, *, p=2):
    """(sum |x|^p)^(1/p) over all spatial axes, kept as size-1 axes."""
    xp = xp_of(X)
    if X.ndim < 3:
        raise ShapeError(f"GlobalLpPool: input must be (N, C, D1, ...), got {tuple(X.shape)}")
    x = to_compute(X)
    axes = tuple(range(2, X.ndim))
    p = float(p)
    if p == 2.0:
        y = xp.sqrt((x * x).sum(axis=axes, keepdims=True))
    else:
        y = (xp.abs(x) ** p).sum(axis=axes, keepdims=True) ** (1.0 / p)
    return y.astype(X.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# Channels-last pools (internal: written by the layout pass, workbench.graph.layout)
# --------------------------------------------------------------------------------------------

def _nhwc_setup(op, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    if X.ndim != 4:
        raise ShapeError(f"{op}: input must be (N, H, W, C), got shape {tuple(X.shape)}")
    if kernel_shape is None or len(kernel_shape) != 2:
        raise ShapeError(f"{op}: attribute kernel_shape={kernel_shape} must give 2 sizes")
    ks = [int(k) for k in kernel_shape]
    st = spatial_ints(op, "strides", strides, 2, 1)
    dl = spatial_ints(op, "dilations", dilations, 2, 1)
    pb, pe, out, extra = window_geometry(op, X.shape[1:3], ks, st, dl, pads, auto_pad,
                                         ceil_mode=bool(ceil_mode))
    return PoolWindow(ks, st, dl, pb, pe, out, extra)


@kernel("NhwcMaxPool", since=1, domain=FUSED_DOMAIN, category="pooling")
def nhwc_max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                  pads=None, strides=None):
    """MaxPool on (N, H, W, C) activations (MaxPool's attributes; no Indices output)."""
    ks, st, dl, pb, _pe, out, _extra = _nhwc_setup("NhwcMaxPool", X, kernel_shape, strides,
                                                   dilations, pads, auto_pad, ceil_mode)
    if X.dtype == np.float32 and xp_of(X) is np:
        k = compiled.kernel(_MAXPOOL_C)
        if k is not None:
            return _nhwc_max_pool_c(k, np.ascontiguousarray(X), ks, st, dl, pb, out)
    x = X if X.dtype.kind in "iub" else to_compute(X)
    y = _window_reduce(x, ks, st, dl, pb, out, "max", channels_last=True)
    return y.astype(X.dtype, copy=False)


_MAXPOOL_C = "dwconv_avx2.maxpool"   # the C NHWC max pool (float32)
_C_BLOCK = 1 << 16   # output elements per block of a split C call
_C_SPLIT_MIN = 1 << 21   # window taps x channels under which a C call is not split


def _nhwc_max_pool_c(k, x, ks, st, dl, pb, out):
    """``dwconv_avx2.maxpool`` over blocks of output rows (one call when the work is small:
    handing a ~0.1 ms call's halves to the pool costs more than it saves)."""
    N, H, W, C = (int(v) for v in x.shape)
    OH, OW = (int(v) for v in out)
    y = np.empty((N, OH, OW, C), np.float32)
    rows = N * OH
    if y.size == 0:
        return y
    per_row = OW * C
    work = rows * per_row * ks[0] * ks[1]
    if work >= _C_SPLIT_MIN:
        step = max(1, min(_C_BLOCK // max(1, per_row), -(-rows // (2 * n_workers()))))
        jobs = [(r, min(rows, r + step)) for r in range(0, rows, step)]
    else:
        jobs = [(0, rows)]
    dp = compiled.data_pointer
    head = [dp(x), dp(y), N, H, W, C, OH, OW, ks[0], ks[1], st[0], st[1], dl[0], dl[1],
            pb[0], pb[1]]
    call_blocks(k, [np.array(head + [r0, r1], np.int64) for r0, r1 in jobs], work)
    return y


@kernel("NhwcAveragePool", since=1, domain=FUSED_DOMAIN, category="pooling")
def nhwc_average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                      dilations=None, kernel_shape=None, pads=None, strides=None):
    """AveragePool on (N, H, W, C) activations (AveragePool's attributes)."""
    op = "NhwcAveragePool"
    ks, st, dl, pb, pe, out, _extra = _nhwc_setup(op, X, kernel_shape, strides, dilations,
                                                  pads, auto_pad, ceil_mode)
    xp = xp_of(X)
    if X.shape[0] * X.shape[3] == 0:
        return xp.empty((X.shape[0], *out, X.shape[3]), dtype=X.dtype)
    x = to_compute(X)
    acc = _window_reduce(x, ks, st, dl, pb, out, "sum", channels_last=True)
    counts = _axis_counts(op, X.shape[1:3], pb, pe, ks, st, dl, out, bool(count_include_pad))
    ch = xp.asarray([1.0 / max(v, 1) for v in counts[0]], dtype=x.dtype).reshape(-1, 1, 1)
    cw = xp.asarray([1.0 / max(v, 1) for v in counts[1]], dtype=x.dtype).reshape(1, -1, 1)
    acc *= ch * cw
    return acc.astype(X.dtype, copy=False)


@kernel("NhwcGlobalAveragePool", since=1, domain=FUSED_DOMAIN, category="pooling")
def nhwc_global_average_pool(X):
    """GlobalAveragePool on (N, H, W, C): the mean over H and W, kept as size-1 axes."""
    if X.ndim != 4:
        raise ShapeError(f"NhwcGlobalAveragePool: input must be (N, H, W, C), got "
                         f"{tuple(X.shape)}")
    cd = compute_dtype(X.dtype)
    return X.mean(axis=(1, 2), keepdims=True, dtype=cd).astype(X.dtype, copy=False)


@kernel("NhwcGlobalMaxPool", since=1, domain=FUSED_DOMAIN, category="pooling")
def nhwc_global_max_pool(X):
    """GlobalMaxPool on (N, H, W, C): the max over H and W, kept as size-1 axes."""
    if X.ndim != 4:
        raise ShapeError(f"NhwcGlobalMaxPool: input must be (N, H, W, C), got "
                         f"{tuple(X.shape)}")
    x = X if X.dtype.kind in "iub" else to_compute(X)
    return x.max(axis=(1, 2), keepdims=True).astype(X.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# MaxUnpool
# --------------------------------------------------------------------------------------------

@kernel("MaxUnpool", since=9, category="pooling", host_read_inputs=(2,))
def max_unpool(X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    """Scatter X into zeros at the flat indices I (as produced by MaxPool's Indices)."""
    op = "MaxUnpool"
    xp = xp_of(X)
    if X.ndim < 3 or tuple(I.shape) != tuple(X.shape):
        raise ShapeError(f"{op}: X must be (N, C, D1, ...) and I the same shape, got X "
                         f"{tuple(X.shape)}, I {tuple(I.shape)}")
    nd = X.ndim - 2
    if kernel_shape is None or len(kernel_shape) != nd:
        raise ShapeError(f"{op}: attribute kernel_shape={kernel_shape} needs {nd} values")
    ks = [int(k) for k in kernel_shape]
    st = spatial_ints(op, "strides", strides, nd, 1)
    p = [0] * (2 * nd) if pads is None or len(pads) == 0 else [int(v) for v in pads]
    if len(p) != 2 * nd:
        raise ShapeError(f"{op}: attribute pads={p} needs {2 * nd} values")
    inferred = list(X.shape[:2]) + [(i - 1) * s + k - p[a] - p[nd + a]
                                    for a, (i, s, k) in enumerate(zip(X.shape[2:], st, ks))]
    # indices address the inferred (pre-pooling) shape; a given output_shape places that
    # block at the origin of a zero tensor of that shape (the spec's reference behaviour)
    y = xp.zeros(inferred, dtype=X.dtype)
    total = int(math.prod(inferred))
    flat_i = I.reshape(-1).astype(xp.int64, copy=False)
    if flat_i.size and (int(flat_i.min()) < 0 or int(flat_i.max()) >= total):
        raise ShapeError(f"{op}: indices must lie in [0, {total}) for the unpooled shape "
                         f"{inferred}")
    y.reshape(-1)[flat_i] = X.reshape(-1)
    if output_shape is None:
        return y
    shape = [int(v) for v in output_shape.reshape(-1).tolist()]
    if len(shape) != X.ndim:
        raise ShapeError(f"{op}: output_shape {shape} must have rank {X.ndim}")
    if shape == inferred:
        return y
    out = xp.zeros(shape, dtype=X.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred))
    out[common] = y[common]
    return out


# --------------------------------------------------------------------------------------------
# MaxRoiPool, RoiAlign
# --------------------------------------------------------------------------------------------

def _round_half_away(v):
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


@kernel("MaxRoiPool", since=1, category="pooling")
def max_roi_pool(X, rois, *, pooled_shape=None, spatial_scale=1.0):
    """ROI max pooling (Fast R-CNN): max over integer-rounded bins of each ROI."""
    op = "MaxRoiPool"
    xp = xp_of(X)
    if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise ShapeError(f"{op}: X must be (N, C, H, W) and rois (num_rois, 5), got X "
                         f"{tuple(X.shape)}, rois {tuple(rois.shape)}")
    if pooled_shape is None or len(pooled_shape) != 2:
        raise InputError(f"{op}: attribute pooled_shape (height, width) is required")
    ph_n, pw_n = (int(v) for v in pooled_shape)
    N, C, H, W = (int(v) for v in X.shape)
    x = to_compute(X)
    R = int(rois.shape[0])
    y = xp.zeros((R, C, ph_n, pw_n), dtype=x.dtype)
    for r, roi in enumerate(rois.tolist()):
        b = int(roi[0])
        if not 0 <= b < N:
            raise ShapeError(f"{op}: roi {r} has batch index {b} outside [0, {N})")
        x1, y1, x2, y2 = (_round_half_away(v * spatial_scale) for v in roi[1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = rh / ph_n, rw / pw_n
        for ph in range(ph_n):
            hs = min(max(math.floor(ph * bh) + y1, 0), H)
            he = min(max(math.ceil((ph + 1) * bh) + y1, 0), H)
            if he <= hs:
                continue
            rowmax = x[b, :, hs:he, :].max(axis=1)
            for pw in range(pw_n):
                ws = min(max(math.floor(pw * bw) + x1, 0), W)
                we = min(max(math.ceil((pw + 1) * bw) + x1, 0), W)
                if we > ws:
                    y[r, :, ph, pw] = rowmax[:, ws:we].max(axis=1)
    return y.astype(X.dtype, copy=False)


def _bilinear_axis(xp, coords, size):
    """Per-sample (low index, high index, low weight, high weight) along one axis.

    Samples outside [-1, size] get zero weights (they contribute nothing), as in the spec's
    reference (Caffe2/ORT) implementation.
    """
    valid = (coords >= -1.0) & (coords <= size)
    c = xp.maximum(coords, 0.0)
    lo = xp.floor(c).astype(xp.int64)
    at_end = lo >= size - 1
    lo = xp.where(at_end, size - 1, lo)
    hi = xp.where(at_end, size - 1, lo + 1)
    c = xp.where(at_end, lo.astype(c.dtype), c)
    lw = c - lo
    hw = 1.0 - lw
    return lo, hi, xp.where(valid, hw, 0.0), xp.where(valid, lw, 0.0)


def _roi_align(X, rois, batch_indices, mode, oh, ow, sampling_ratio, spatial_scale, half_pixel):
    op = "RoiAlign"
    xp = xp_of(X)
    if X.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
        raise ShapeError(f"{op}: X must be (N, C, H, W) and rois (num_rois, 4), got X "
                         f"{tuple(X.shape)}, rois {tuple(rois.shape)}")
    R = int(rois.shape[0])
    if tuple(batch_indices.shape) != (R,):
        raise ShapeError(f"{op}: batch_indices must have shape ({R},), got "
                         f"{tuple(batch_indices.shape)}")
    mode = (mode or "avg").lower()
    if mode not in ("avg", "max"):
        raise InputError(f"{op}: mode={mode!r} is not supported (supported: 'avg', 'max')")
    N, C, H, W = (int(v) for v in X.shape)
    oh, ow = int(oh), int(ow)
    x = to_compute(X)
    dt = x.dtype
    y = xp.zeros((R, C, oh, ow), dtype=dt)
    off = 0.5 if half_pixel else 0.0
    bidx = [int(v) for v in batch_indices.reshape(-1).tolist()]
    for r, roi in enumerate(rois.tolist()):
        b = bidx[r]
        if not 0 <= b < N:
            raise ShapeError(f"{op}: roi {r} has batch index {b} outside [0, {N})")
        x1, y1, x2, y2 = (float(v) * spatial_scale - off for v in roi)
        rw, rh = x2 - x1, y2 - y1
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rh / oh))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rw / ow))
        if gh <= 0 or gw <= 0:
            continue
        ys = (y1 + xp.arange(oh, dtype=dt).reshape(oh, 1) * bh
              + (xp.arange(gh, dtype=dt).reshape(1, gh) + 0.5) * (bh / gh))
        xs = (x1 + xp.arange(ow, dtype=dt).reshape(ow, 1) * bw
              + (xp.arange(gw, dtype=dt).reshape(1, gw) + 0.5) * (bw / gw))
        ylo, yhi, wyl, wyh = _bilinear_axis(xp, ys, H)
        xlo, xhi, wxl, wxh = _bilinear_axis(xp, xs, W)
        img = x[b]  # (C, H, W)
        if mode == "avg":
            # separable: Y = Ay @ img @ Ax^T, Ay[p, h] = summed weights of the samples of bin p
            Ay = _interp_matrix(xp, ylo, yhi, wyl, wyh, H)
            Ax = _interp_matrix(xp, xlo, xhi, wxl, wxh, W)
            y[r] = xp.matmul(xp.matmul(Ay, img), Ax.T) / (gh * gw)
        else:
            # max over samples of the largest weighted corner (the reference semantics)
            best = None
            for yi, wy in ((ylo, wyl), (yhi, wyh)):
                for xi, wx in ((xlo, wxl), (xhi, wxh)):
                    v = img[:, yi.reshape(oh, gh, 1, 1), xi.reshape(1, 1, ow, gw)]
                    v = v * (wy.reshape(oh, gh, 1, 1) * wx.reshape(1, 1, ow, gw))
                    best = v if best is None else xp.maximum(best, v)
            y[r] = best.max(axis=(2, 4))
    return y.astype(X.dtype, copy=False)


def _interp_matrix(xp, lo, hi, wl, wh, size):
    """(bins, size) matrix summing each bin's bilinear sample weights per input index."""
    grid = xp.arange(size).reshape(1, 1, size)
    m = (lo[..., None] == grid) * wl[..., None] + (hi[..., None] == grid) * wh[..., None]
    return m.sum(axis=1)


@kernel("RoiAlign", since=10, category="pooling")
def roi_align_10(X, rois, batch_indices, *, mode="avg", output_height=1, output_width=1,
                 sampling_ratio=0, spatial_scale=1.0):
    """RoiAlign-10: no half-pixel shift, ROI sizes at least 1 (output_half_pixel)."""
    return _roi_align(X, rois, batch_indices, mode, output_height, output_width,
                      sampling_ratio, spatial_scale, half_pixel=False)


@kernel("RoiAlign", since=16)
def roi_align(X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel",
              mode="avg", output_height=1, output_width=1, sampling_ratio=0,
              spatial_scale=1.0):
    """RoiAlign-16+: bilinear samples per bin, averaged or maxed."""
    ctm = (coordinate_transformation_mode or "half_pixel").lower()
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise InputError(f"RoiAlign: coordinate_transformation_mode={ctm!r} is not supported "
                         f"(supported: 'half_pixel', 'output_half_pixel')")
    return _roi_align(X, rois, batch_indices, mode, output_height, output_width,
                      sampling_ratio, spatial_scale, half_pixel=ctm == "half_pixel")
