"""Indexing: Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND, TensorScatter,
Compress, NonZero, OneHot, Unique.

Indices may be negative (counted from the end of their axis) and are checked against the bounds;
an out-of-range index raises :class:`~workbench.errors.InputError` naming the op, the axis and
its size. Scatter reductions (add, mul, max, min) apply duplicate indices one after another.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops._common import norm_axis, prod, stable_argsort
from workbench.ops.registry import kernel


def _norm_indices(op, xp, indices, dim, axis_desc):
    """int64 indices with negatives wrapped; raises InputError when any is out of [-dim, dim)."""
    idx = xp.asarray(indices).astype(np.int64, copy=False)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -dim or hi >= dim:
            bad = lo if lo < -dim else hi
            raise InputError(f"{op}: index {bad} is out of bounds for {axis_desc} of size {dim} "
                             f"(valid range [{-dim}, {dim - 1}])")
        if lo < 0:
            idx = xp.where(idx < 0, idx + dim, idx)
    return idx


def _along_axis_index(xp, idx, axis):
    """Fancy index addressing ``arr[..., idx[...], ...]`` element-wise along ``axis``: for every
    other dimension d an ``arange(idx.shape[d])`` broadcast against ``idx``."""
    out = []
    for d in range(idx.ndim):
        if d == axis:
            out.append(idx)
        else:
            shape = [1] * idx.ndim
            shape[d] = idx.shape[d]
            out.append(xp.arange(idx.shape[d], dtype=np.int64).reshape(shape))
    return tuple(out)


_HOST_INDEX_TYPES = (np.int64, np.int32)


# Gather family -----------------------------------------------------------------------------------

@kernel("Gather", since=1, category="shape", host_shape_math=True)
def gather(data, indices, *, axis=0):
    """Take the slices ``indices`` along ``axis``; the index dims replace that axis."""
    if type(data) is np.ndarray and type(indices) is np.ndarray \
            and indices.dtype.type in _HOST_INDEX_TYPES and data.ndim:
        # host arrays, int32/int64 indices (embedding lookups, a transformer's [CLS] token):
        # numpy's take wraps negatives and checks the bounds itself; an index out of range
        # takes the checked path below, which names the op, the axis and the valid range
        ax = int(axis)
        if -data.ndim <= ax < data.ndim:
            try:
                return np.take(data, indices, axis=ax)
            except IndexError:
                pass
    xp = xp_of(data)
    if data.ndim == 0:
        raise ShapeError("Gather: data must have rank >= 1, got a scalar")
    ax = norm_axis(int(axis), data.ndim, "Gather")
    idx = _norm_indices("Gather", xp, indices, data.shape[ax], f"axis {ax}")
    return xp.take(data, idx, axis=ax)


@kernel("GatherElements", since=11, category="shape")
def gather_elements(data, indices, *, axis=0):
    """``out[i][j][k] = data[indices[i][j][k]][j][k]`` (axis=0); output has the indices shape."""
    xp = xp_of(data)
    r = data.ndim
    ax = norm_axis(int(axis), r, "GatherElements")
    if indices.ndim != r:
        raise ShapeError(f"GatherElements: indices rank {indices.ndim} must equal data rank {r}")
    for d in range(r):
        if d != ax and indices.shape[d] > data.shape[d]:
            raise ShapeError(f"GatherElements: indices shape {tuple(indices.shape)} exceeds data "
                             f"shape {tuple(data.shape)} on axis {d}")
    idx = _norm_indices("GatherElements", xp, indices, data.shape[ax], f"axis {ax}")
    return data[_along_axis_index(xp, idx, ax)]


def _gather_nd(data, indices, batch_dims):
    xp = xp_of(data)
    b = int(batch_dims)
    r, q = data.ndim, indices.ndim
    if r < 1 or q < 1 or b >= min(r, q):
        raise ShapeError(f"GatherND: needs rank(data) >= 1, rank(indices) >= 1 and batch_dims < "
                         f"min of both; got data {tuple(data.shape)}, indices "
                         f"{tuple(indices.shape)}, batch_dims={b}")
    if tuple(data.shape[:b]) != tuple(indices.shape[:b]):
        raise ShapeError(f"GatherND: the first {b} dims of data {tuple(data.shape)} and indices "
                         f"{tuple(indices.shape)} must match")
    k = indices.shape[-1]
    if not 1 <= k <= r - b:
        raise ShapeError(f"GatherND: indices.shape[-1] = {k} must be in [1, {r - b}] "
                         f"(rank(data) - batch_dims)")
    batch_shape = tuple(data.shape[:b])
    nb = prod(batch_shape)
    mid_shape = tuple(indices.shape[b:-1])
    tail_shape = tuple(data.shape[b + k:])
    d = data.reshape((nb,) + tuple(data.shape[b:]))
    idx = xp.asarray(indices).astype(np.int64, copy=False).reshape(nb, prod(mid_shape), k)
    parts = [xp.arange(nb, dtype=np.int64)[:, None]]
    for j in range(k):
        dim = data.shape[b + j]
        parts.append(_norm_indices("GatherND", xp, idx[..., j], dim, f"data axis {b + j}"))
    out = d[tuple(parts)]
    return out.reshape(batch_shape + mid_shape + tail_shape)


@kernel("GatherND", since=11, category="shape")
def gather_nd(data, indices, *, batch_dims=0):
    """Gather slices of ``data`` addressed by the index tuples in the last dim of ``indices``
    (``batch_dims`` leading dims shared, from opset 12)."""
    return _gather_nd(data, indices, batch_dims)


# Scatter family ----------------------------------------------------------------------------------

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _occurrence_rounds(xp, lin):
    """For each position of ``lin``: how many earlier positions hold the same value."""
    n = lin.shape[0]
    order = stable_argsort(xp, lin)
    s = lin[order]
    new_group = xp.ones(n, dtype=bool)
    new_group[1:] = s[1:] != s[:-1]
    group_id = xp.cumsum(new_group) - 1
    group_start = xp.nonzero(new_group)[0][group_id]
    rank = xp.empty(n, dtype=np.int64)
    rank[order] = xp.arange(n, dtype=np.int64) - group_start
    return rank


_UFUNC = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter_rows(op, out2, lin, upd2, reduction):
    """``out2[lin[i]] = f(out2[lin[i]], upd2[i])`` for each i, in order, on a (R, C) array."""
    xp = xp_of(out2)
    if reduction not in _REDUCTIONS:
        raise InputError(f"{op}: reduction {reduction!r} is not supported "
                         f"({', '.join(_REDUCTIONS)})")
    if lin.shape[0] == 0:
        return
    if reduction == "none":
        out2[lin] = upd2
        return
    ufunc = getattr(xp, _UFUNC[reduction])
    if xp is np and hasattr(ufunc, "at"):
        ufunc.at(out2, lin, upd2)
        return
    rank = _occurrence_rounds(xp, lin)
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        rows = lin[sel]
        out2[rows] = ufunc(out2[rows], upd2[sel])


def _scatter_elements(op, data, indices, updates, axis, reduction):
    xp = xp_of(data)
    r = data.ndim
    ax = norm_axis(int(axis), r, op)
    if indices.ndim != r or tuple(indices.shape) != tuple(updates.shape):
        raise ShapeError(f"{op}: indices {tuple(indices.shape)} and updates "
                         f"{tuple(updates.shape)} must have the same shape and the rank of data "
                         f"{tuple(data.shape)}")
    for d in range(r):
        if d != ax and indices.shape[d] > data.shape[d]:
            raise ShapeError(f"{op}: indices shape {tuple(indices.shape)} exceeds data shape "
                             f"{tuple(data.shape)} on axis {d}")
    idx = _norm_indices(op, xp, indices, data.shape[ax], f"axis {ax}")
    out = data.copy()
    full = _along_axis_index(xp, idx, ax)
    lin = xp.zeros(idx.shape, dtype=np.int64)
    for d, part in enumerate(full):
        lin = lin * data.shape[d] + part
    _scatter_rows(op, out.reshape(-1, 1), lin.reshape(-1), updates.reshape(-1, 1), reduction)
    return out


@kernel("Scatter", since=9, category="shape")
def scatter(data, indices, updates, *, axis=0):
    """Scatter-9..10 (deprecated): the same as ScatterElements without reduction."""
    return _scatter_elements("Scatter", data, indices, updates, axis, "none")


@kernel("ScatterElements", since=11, category="shape")
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    """A copy of ``data`` with ``updates`` written (or reduced, from 16) at ``indices`` along
    ``axis``."""
    return _scatter_elements("ScatterElements", data, indices, updates, axis, reduction)


@kernel("ScatterND", since=11, category="shape")
def scatter_nd(data, indices, updates, *, reduction="none"):
    """A copy of ``data`` with slices replaced (or reduced, from 16) at the index tuples in the
    last dim of ``indices``."""
    xp = xp_of(data)
    r = data.ndim
    k = indices.shape[-1] if indices.ndim else 0
    if indices.ndim < 1 or not 1 <= k <= r:
        raise ShapeError(f"ScatterND: indices shape {tuple(indices.shape)} needs rank >= 1 and a "
                         f"last dim in [1, {r}] (rank of data {tuple(data.shape)})")
    expect = tuple(indices.shape[:-1]) + tuple(data.shape[k:])
    if tuple(updates.shape) != expect:
        raise ShapeError(f"ScatterND: updates shape {tuple(updates.shape)} must be "
                         f"indices.shape[:-1] + data.shape[k:] = {expect}")
    idx = xp.asarray(indices).astype(np.int64, copy=False).reshape(-1, k)
    lin = xp.zeros(idx.shape[0], dtype=np.int64)
    for j in range(k):
        dim = data.shape[j]
        lin = lin * dim + _norm_indices("ScatterND", xp, idx[:, j], dim, f"data axis {j}")
    out = data.copy()
    rest = prod(data.shape[k:])
    _scatter_rows("ScatterND", out.reshape(prod(data.shape[:k]), rest), lin,
                  updates.reshape(idx.shape[0], rest), reduction)
    return out


@kernel("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """KV-cache update: ``update`` written into a copy of ``past_cache`` along ``axis`` from
    ``write_indices[b]`` for each batch entry (modulo the cache length when circular)."""
    xp = xp_of(past_cache)
    r = past_cache.ndim
    ax = norm_axis(int(axis), r, "TensorScatter")
    if ax == 0:
        raise ShapeError("TensorScatter: axis cannot be 0 (the batch dimension)")
    if mode not in ("linear", "circular"):
        raise InputError(f"TensorScatter: mode {mode!r} is not supported (linear, circular)")
    ps, us = tuple(past_cache.shape), tuple(update.shape)
    if update.ndim != r or any(ps[d] != us[d] for d in range(r) if d != ax) or us[ax] > ps[ax]:
        raise ShapeError(f"TensorScatter: update shape {us} must match the cache shape {ps} "
                         f"except on axis {ax}, where it may not be longer")
    batch, max_len, seq_len = ps[0], ps[ax], us[ax]
    if write_indices is None:
        starts = xp.zeros(batch, dtype=np.int64)
    else:
        starts = xp.asarray(write_indices).astype(np.int64, copy=False).reshape(-1)
    pos = starts[:, None] + xp.arange(seq_len, dtype=np.int64)[None, :]     # (B, S)
    if mode == "circular":
        pos = pos % max_len
    elif pos.size and (int(pos.min()) < 0 or int(pos.max()) >= max_len):
        raise InputError(f"TensorScatter: write_indices + sequence length {seq_len} exceed the "
                         f"cache length {max_len} in linear mode")
    shape = [1] * r
    shape[0], shape[ax] = batch, seq_len
    idx = xp.broadcast_to(pos.reshape(shape), us)
    out = past_cache.copy()
    out[_along_axis_index(xp, idx, ax)] = update
    return out


# Selection ---------------------------------------------------------------------------------------

@kernel("Compress", since=9, category="shape")
def compress(input, condition, *, axis=None):
    """Keep the slices along ``axis`` (or elements of the flattened input) where ``condition``
    is true; a shorter condition drops the remaining slices."""
    xp = xp_of(input)
    cond = xp.asarray(condition).reshape(-1).astype(bool, copy=False)
    if axis is None:
        data, ax = input.reshape(-1), 0
    else:
        data, ax = input, norm_axis(int(axis), input.ndim, "Compress")
    n = data.shape[ax]
    if cond.shape[0] > n:
        if bool(cond[n:].any()):
            raise ShapeError(f"Compress: condition has {cond.shape[0]} values, more than the "
                             f"{n} slices along axis {ax}, and selects beyond them")
        cond = cond[:n]
    keep = xp.nonzero(cond)[0]
    return xp.take(data, keep, axis=ax)


@kernel("NonZero", since=9, category="shape")
def non_zero(x):
    """Indices of the non-zero elements, shape (rank, count), row-major order."""
    xp = xp_of(x)
    if x.ndim == 0:
        return xp.zeros((0, int(bool(x))), dtype=np.int64)
    nz = xp.nonzero(x)
    return xp.stack([i.astype(np.int64, copy=False) for i in nz])


@kernel("OneHot", since=9, category="shape", host_read_inputs=(1,), settings=(1, 2))
def one_hot(indices, depth, values, *, axis=-1):
    """One-hot encode ``indices`` along a new ``axis`` of size ``depth``; ``values`` is
    [off, on]; indices outside [-depth, depth) give all-off rows."""
    xp = xp_of(indices)
    d = xp.asarray(depth).reshape(-1)
    if d.shape[0] != 1:
        raise ShapeError(f"OneHot: depth must hold one value, got shape {tuple(depth.shape)}")
    depth_f = float(d[0])
    if not np.isfinite(depth_f):
        raise ShapeError(f"OneHot: depth must be finite, got {depth_f}")
    depth_v = int(depth_f)
    if depth_v < 1:
        raise ShapeError(f"OneHot: depth must be >= 1, got {depth_v}")
    vals = xp.asarray(values).reshape(-1)
    if vals.shape[0] != 2:
        raise ShapeError(f"OneHot: values must hold [off_value, on_value], got "
                         f"{vals.shape[0]} values")
    r = indices.ndim
    if not -r - 1 <= axis <= r:
        raise ShapeError(f"OneHot: axis {axis} is out of range [{-r - 1}, {r}] for indices of "
                         f"rank {r}")
    ax = axis + r + 1 if axis < 0 else axis
    ind = indices
    if ind.dtype.kind == "f":
        ind = xp.trunc(ind)
    ind = ind.astype(np.int64)
    ind = xp.where(ind < 0, ind + depth_v, ind)
    out_shape = list(indices.shape)
    out_shape.insert(ax, depth_v)
    check_alloc(out_shape, vals.dtype, what="OneHot: the output")
    ind = xp.expand_dims(ind, ax)
    shape = [1] * (r + 1)
    shape[ax] = depth_v
    hot = ind == xp.arange(depth_v, dtype=np.int64).reshape(shape)
    return xp.where(hot, vals[1], vals[0])


# Unique ------------------------------------------------------------------------------------------

def _sort_rows(xp, rows):
    """Stable lexicographic order of the rows of a 2-D array (column 0 most significant)."""
    if rows.shape[1] == 0:
        return xp.arange(rows.shape[0], dtype=np.int64)
    if xp is np:
        return np.lexsort(rows.T[::-1])
    order = xp.arange(rows.shape[0], dtype=np.int64)
    for c in range(rows.shape[1] - 1, -1, -1):  # least significant key first
        order = order[stable_argsort(xp, rows[order, c])]
    return order


@kernel("Unique", since=11, wants_ctx=True)
def unique(x, *, axis=None, sorted=1, ctx):
    """Unique values (or sub-tensors along ``axis``) with first-occurrence indices, inverse
    indices and counts, sorted ascending or in order of first occurrence."""
    xp = xp_of(x)
    if axis is None:
        ax, moved = 0, x.reshape(-1)
    else:
        ax = norm_axis(int(axis), x.ndim, "Unique")
        moved = xp.moveaxis(x, ax, 0)
    n = moved.shape[0]
    rows = moved.reshape(n, prod(moved.shape[1:]))
    keys = rows
    if keys.dtype.name == "bfloat16" or keys.dtype.kind == "b":
        keys = keys.astype(np.float32)
    if n == 0:
        order = xp.zeros(0, dtype=np.int64)
        new_group = xp.zeros(0, dtype=bool)
    else:
        order = _sort_rows(xp, keys)
        s = keys[order]
        new_group = xp.ones(n, dtype=bool)
        differs = s[1:] != s[:-1]
        if s.dtype.kind == "f":  # NaNs compare equal to each other here, as numpy.unique
            differs &= ~(xp.isnan(s[1:]) & xp.isnan(s[:-1]))
        new_group[1:] = xp.any(differs, axis=1)
    group_id = xp.cumsum(new_group) - 1
    starts = xp.nonzero(new_group)[0]
    first = order[starts]                      # stable order: the first occurrence leads
    counts = xp.diff(xp.concatenate([starts, xp.asarray([n], dtype=starts.dtype)]))
    inverse = xp.empty(n, dtype=np.int64)
    inverse[order] = group_id
    if not sorted:
        by_first = stable_argsort(xp, first)
        first, counts = first[by_first], counts[by_first]
        remap = xp.empty_like(by_first)
        remap[by_first] = xp.arange(by_first.shape[0], dtype=by_first.dtype)
        inverse = remap[inverse]
    y = xp.take(moved, first, axis=0)
    if axis is not None:
        y = xp.moveaxis(y, 0, ax)
    outs = (y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))
    return outs[:max(ctx.n_outputs, 1)]
