"""Gradients of shape and indexing ops: Reshape/Flatten/Squeeze/Unsqueeze, Transpose, Concat,
Split, Slice, Gather, GatherElements, Expand, Tile, Pad, DepthToSpace/SpaceToDepth.

Every opset form is handled (attributes that later became inputs: Slice-1..9, Split-2..12,
Squeeze/Unsqueeze-1..12, Pad-2..10)."""

from __future__ import annotations

import numpy as np

from workbench import compiled
from workbench.autodiff.rules import gradient, ints, unbroadcast
from workbench.errors import GradientError


def scatter_add(xp, target, index, values):
    """``target[index] += values`` with repeated indices accumulated (numpy and cupy)."""
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        try:
            xp.add.at(target, index, values)
            return target
        except (NotImplementedError, TypeError):
            pass
    import cupyx  # pragma: no cover - GPU only
    cupyx.scatter_add(target, index, values)
    return target


#: repeats of one index up to which :func:`_scatter_rows` adds in passes, and distinct
#: indices up to which it sums each index's rows by one running sum
_PASSES_MAX = 8
_SCATTER_MIN = 8192


def _scatter_rows_c(target, index, values) -> bool:
    """:func:`_scatter_rows` by ``wgrad_avx2.scatter_rows`` (add.at's loop in C: ~10-20x
    faster than the numpy ways below at an embedding's few hundred rows) on float32; False
    (nothing written) when it does not apply, is not loaded, or an index is out of range."""
    if target.dtype != np.float32 or values.dtype != np.float32 or target.ndim < 1 \
            or not target.flags.c_contiguous or not target.flags.writeable \
            or values.shape != index.shape + target.shape[1:]:
        return False
    kern = compiled.kernel("wgrad_avx2.scatter_rows")
    if kern is None:
        return False
    index = np.ascontiguousarray(index, dtype=np.int64)
    values = np.ascontiguousarray(values)
    bad = np.ones(1, np.int64)
    dp = compiled.data_pointer
    rows = target.shape[0]
    kern.raw(dp(target), dp(index), dp(values), dp(bad), index.size,
             target.size // rows if rows else 0, rows)
    return not bad[0]


def _scatter_rows(target, index, values):
    """``np.add.at(target, index, values)`` on a numpy ``target`` of zeros: ``index`` 1-D
    (non-negative, in range), ``values`` one row per index. The same sums in the same order
    (each target row gets its values in index order), without ``add.at``'s element-by-element
    loop (~150-350 us for an embedding's 256 rows of 64): unique indices in one fancy-indexed
    add; few repeats (word embeddings) in one pass per repeat (each pass's indices distinct);
    few distinct indices (segment ids) by a running sum (``add.accumulate``, sequential by
    definition) per index, added to the zero row (which turns a -0.0 sum into 0.0, as add.at's
    first add does). ``add.at`` itself otherwise, and for small scatters (under
    ``_SCATTER_MIN`` values), where add.at costs less than the sort."""
    n = index.size
    if _scatter_rows_c(target, index, values):
        return target
    if values.size < _SCATTER_MIN:
        np.add.at(target, index, values)
        return target
    order = np.argsort(index, kind="stable")
    si = index[order]
    starts = np.concatenate(([0], np.flatnonzero(si[1:] != si[:-1]) + 1))
    counts = np.diff(np.concatenate((starts, [n])))
    most = int(counts.max())
    if most == 1:
        target[index] += values
    elif most <= _PASSES_MAX:
        rank = np.empty(n, np.intp)
        rank[order] = np.arange(n) - np.repeat(starts, counts)
        for r in range(most):
            sel = np.flatnonzero(rank == r)
            target[index[sel]] += values[sel]
    elif len(starts) <= _PASSES_MAX:
        for s0, c in zip(starts.tolist(), counts.tolist()):
            target[si[s0]] += np.add.accumulate(values[order[s0:s0 + c]], axis=0)[-1]
    else:
        np.add.at(target, index, values)
    return target


@gradient("Reshape")
@gradient("Flatten")
@gradient("Squeeze")
@gradient("Unsqueeze")
def reshape_grad(ctx, grads_out, inputs, outputs, **attrs):
    return (grads_out[0].reshape(inputs[0].shape),)


@gradient("Transpose")
def transpose_grad(ctx, grads_out, inputs, outputs, *, perm=None, **attrs):
    x = inputs[0]
    n = x.ndim
    if perm is None:
        perm = range(n - 1, -1, -1)
    inv = [0] * n   # the inverse permutation (argsort of perm), without numpy on a few ints
    i = 0
    for p in perm:
        inv[int(p) % n] = i
        i += 1
    return (grads_out[0].transpose(inv),)


@gradient("Concat")
def concat_grad(ctx, grads_out, inputs, outputs, *, axis=0, **attrs):
    g = grads_out[0]
    ax = axis % g.ndim
    out = []
    start = 0
    for i, x in enumerate(inputs):
        n = x.shape[ax]
        if ctx.needs_input_grad[i]:
            sl = [slice(None)] * g.ndim
            sl[ax] = slice(start, start + n)
            out.append(g[tuple(sl)])
        else:
            out.append(None)
        start += n
    return tuple(out)


@gradient("Split")
def split_grad(ctx, grads_out, inputs, outputs, *, axis=0, **attrs):
    xp = ctx.xp
    x = inputs[0]
    parts = [go if go is not None else xp.zeros(o.shape, dtype=x.dtype)
             for go, o in zip(grads_out, outputs)]
    return (xp.concatenate(parts, axis=axis % x.ndim),) + (None,) * (len(inputs) - 1)


def slice_index(shape, starts, ends, axes, steps):
    """The Python index tuple of an ONNX Slice (clamping as the spec says)."""
    nd = len(shape)
    axes = list(range(len(starts))) if not axes else [a % nd for a in axes]
    steps = steps or [1] * len(starts)
    index = [slice(None)] * nd
    for st, en, ax, step in zip(starts, ends, axes, steps):
        dim = shape[ax]
        if st < 0:
            st += dim
        if en < 0:
            en += dim
        if step > 0:
            st = min(max(st, 0), dim)
            en = min(max(en, 0), dim)
            index[ax] = slice(st, en, step)
        else:
            st = min(max(st, 0), dim - 1)
            en = min(max(en, -1), dim - 1)
            index[ax] = slice(st, None if en == -1 else en, step)
    return tuple(index)


@gradient("Slice")
def slice_grad(ctx, grads_out, inputs, outputs, **attrs):
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    if ctx.opset < 10:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else None
    gx = xp.zeros(x.shape, dtype=g.dtype)
    gx[slice_index(x.shape, starts, ends, axes, steps)] = g
    return (gx,) + (None,) * (len(inputs) - 1)


@gradient("Gather")
def gather_grad(ctx, grads_out, inputs, outputs, *, axis=0, **attrs):
    xp = ctx.xp
    x, idx = inputs
    g = grads_out[0]
    ax = axis % x.ndim
    n = x.shape[ax]
    idx = xp.where(idx < 0, idx + n, idx)
    gx = xp.zeros(x.shape, dtype=g.dtype)
    scatter = _scatter_rows if xp is np and type(g) is np.ndarray \
        and idx.dtype.kind in "iu" else lambda t, i, v: scatter_add(xp, t, i, v)
    if ax == 0 and idx.ndim >= 1:
        scatter(gx, idx.reshape(-1), g.reshape((-1,) + x.shape[1:]))
        return gx, None
    # move the gathered axes to the front, scatter along axis 0, move back
    gxm = xp.moveaxis(gx, ax, 0)
    gm = xp.moveaxis(g, tuple(range(ax, ax + idx.ndim)), tuple(range(idx.ndim)))
    scatter(gxm, idx.reshape(-1), gm.reshape((-1,) + gxm.shape[1:]))
    return gx, None


@gradient("GatherElements")
def gather_elements_grad(ctx, grads_out, inputs, outputs, *, axis=0, **attrs):
    xp = ctx.xp
    x, idx = inputs
    g = grads_out[0]
    ax = axis % x.ndim
    idx = xp.where(idx < 0, idx + x.shape[ax], idx)
    grids = [xp.arange(n).reshape((1,) * i + (n,) + (1,) * (idx.ndim - i - 1))
             for i, n in enumerate(idx.shape)]
    grids[ax] = idx
    gx = xp.zeros(x.shape, dtype=g.dtype)
    scatter_add(xp, gx, tuple(grids), g)
    return gx, None


@gradient("ScatterElements")
def scatter_elements_grad(ctx, grads_out, inputs, outputs, *, axis=0, reduction="none",
                          **attrs):
    """data: the output gradient where nothing was written over it (everywhere for
    ``reduction="add"``); updates: the output gradient at the positions they went to
    (duplicate indices with ``reduction="none"`` are undefined in ONNX; each gets it)."""
    xp = ctx.xp
    x, idx, upd = inputs
    g = grads_out[0]
    if reduction not in ("none", "add"):
        raise GradientError(f"ScatterElements: no gradient for reduction={reduction!r} "
                            f"(only 'none' and 'add')")
    ax = axis % x.ndim
    idx = xp.where(idx < 0, idx + x.shape[ax], idx)
    grids = [xp.arange(n).reshape((1,) * i + (n,) + (1,) * (idx.ndim - i - 1))
             for i, n in enumerate(idx.shape)]
    grids[ax] = idx
    where = tuple(xp.broadcast_arrays(*grids))
    gx = None
    if ctx.needs_input_grad[0]:
        gx = g.copy()
        if reduction == "none":
            gx[where] = 0
    gu = g[where] if len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2] else None
    return gx, None, gu


@gradient("Expand")
def expand_grad(ctx, grads_out, inputs, outputs, **attrs):
    return unbroadcast(grads_out[0], inputs[0].shape), None


@gradient("Tile")
def tile_grad(ctx, grads_out, inputs, outputs, **attrs):
    x = inputs[0]
    g = grads_out[0]
    reps = ints(inputs[1])
    shape = []
    for r, d in zip(reps, x.shape):
        shape += [r, d]
    return (g.reshape(shape).sum(axis=tuple(range(0, 2 * x.ndim, 2))),) + (None,) * (
        len(inputs) - 1)


@gradient("Pad")
def pad_grad(ctx, grads_out, inputs, outputs, *, mode="constant", **attrs):
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    nd = x.ndim
    if ctx.opset < 11:
        pads = list(attrs.get("pads") or attrs.get("paddings") or [])
        axes = list(range(nd))
    else:
        pads = ints(inputs[1])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(
            range(nd))
        axes = [a % nd for a in axes]
    na = len(axes)
    begin, end = [0] * nd, [0] * nd
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[na + i]
    rest = (None,) * (len(inputs) - 1)
    if mode == "constant":
        gx = xp.zeros(x.shape, dtype=g.dtype)
        src, dst = [], []
        for a in range(nd):
            b, e = begin[a], end[a]
            lo_x, lo_g = max(0, -b), max(0, b)
            n = x.shape[a] - lo_x - max(0, -e)
            src.append(slice(lo_g, lo_g + n))
            dst.append(slice(lo_x, lo_x + n))
        gx[tuple(dst)] = g[tuple(src)]
        return (gx,) + rest
    # reflect / edge / wrap: pad an index map the same way and scatter-add the gradient
    np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    idx = xp.arange(x.size, dtype=xp.int64).reshape(x.shape)
    widths = [(max(0, begin[a]), max(0, end[a])) for a in range(nd)]
    pidx = xp.pad(idx, widths, mode=np_mode)
    crop = tuple(slice(max(0, -begin[a]), pidx.shape[a] - max(0, -end[a])) for a in range(nd))
    pidx = pidx[crop]
    gx = xp.zeros(x.size, dtype=g.dtype)
    scatter_add(xp, gx, pidx.reshape(-1), g.reshape(-1))
    return (gx.reshape(x.shape),) + rest


@gradient("DepthToSpace")
def depth_to_space_grad(ctx, grads_out, inputs, outputs, *, blocksize, mode="DCR", **attrs):
    g = grads_out[0]
    n, c, h, w = inputs[0].shape
    b = blocksize
    if mode == "DCR":
        t = g.reshape(n, c // (b * b), h, b, w, b).transpose(0, 3, 5, 1, 2, 4)
    else:
        t = g.reshape(n, c // (b * b), h, b, w, b).transpose(0, 1, 3, 5, 2, 4)
    return (t.reshape(n, c, h, w),)


@gradient("SpaceToDepth")
def space_to_depth_grad(ctx, grads_out, inputs, outputs, *, blocksize, **attrs):
    g = grads_out[0]
    n, c, h, w = inputs[0].shape
    b = blocksize
    t = g.reshape(n, b, b, c, h // b, w // b).transpose(0, 3, 4, 1, 5, 2)
    return (t.reshape(n, c, h, w),)


@gradient("Resize")
@gradient("Upsample")
def resize_nearest_grad(ctx, grads_out, inputs, outputs, *, mode="nearest", **attrs):
    """Nearest-neighbour resizing copies input elements: the forward kernel run on a map of
    element indices gives, for each output, its source; gradients are scatter-added back.
    (The linear/cubic modes have no rule yet.)"""
    from workbench.errors import GradientError
    from workbench.ops.registry import lookup
    if mode != "nearest":
        raise GradientError(f"{ctx.op_type}: no gradient rule for mode {mode!r} (only "
                            f"'nearest')")
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    idx = xp.arange(x.size, dtype=xp.int64).reshape(x.shape)
    kw = {k: v for k, v in attrs.items() if k != "training"}
    src = lookup(ctx.op_type, "", ctx.opset).fn(idx, *inputs[1:], mode=mode, **kw)
    gx = xp.zeros(x.size, dtype=g.dtype)
    scatter_add(xp, gx, src.reshape(-1), g.reshape(-1))
    return (gx.reshape(x.shape),) + (None,) * (len(inputs) - 1)
