"""Resampling: Resize, Upsample, GridSample, AffineGrid.

Resize works one axis at a time: for every resized axis a small table of source indices and
weights (``out_len x taps``) is built from the coordinate transformation, then the tensor is
gathered ``taps`` times along that axis and the weighted slices are summed. N-linear and N-cubic
interpolation are separable, so this equals the N-D interpolation without any loop over pixels.
Axes whose output equals the input (same size, identity coordinates) are skipped.

Opset differences:

* Upsample-7 takes ``scales`` as an attribute, Upsample-9/10 as an input; both use the
  ``asymmetric`` coordinate transformation (``x_in = x_out / scale``) and, for nearest, the
  index ``floor(x_in)`` (``ceil`` when down-sampling), which is also what Resize-10 does.
* Resize-11 adds ``roi``, ``sizes``, the coordinate transformation modes, cubic interpolation
  and ``nearest_mode``; Resize-13 makes ``roi``/``scales`` optional; Resize-18 adds
  ``antialias``, ``axes`` and ``keep_aspect_ratio_policy``; Resize-19 adds the
  ``half_pixel_symmetric`` mode. One kernel serves 11 and later: the newer attributes simply keep
  their defaults on older models.

GridSample-16 names its modes ``bilinear``/``nearest``/``bicubic`` and is 2-D only; GridSample-20
renames them ``linear``/``nearest``/``cubic`` and accepts any number of spatial dimensions. Both
spellings are accepted at every version.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops._common import floats, ints, norm_axis
from workbench.ops.registry import kernel

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_MODE_ALIASES = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}


def _compute_dtype(x):
    """The dtype interpolation is computed in: float64 for double/int64, complex stays complex."""
    dt = x.dtype
    if dt.kind == "c":
        return dt
    if dt == np.float64 or dt.kind in "iu" and dt.itemsize >= 4:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _cast_result(xp, y, dtype):
    """Cast an interpolated float result back to the input dtype (integers are rounded)."""
    dtype = np.dtype(dtype)
    if y.dtype == dtype:
        return y
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return xp.clip(xp.rint(y), info.min, info.max).astype(dtype)
    if dtype.kind == "b":
        return y > 0.5
    return y.astype(dtype)


# --------------------------------------------------------------------------------------------
# per-axis coordinate tables


def _source_coords(xp, mode, out_len, in_len, scale, roi_start, roi_end):
    """x_original for every output index along one axis (float64)."""
    i = xp.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len) if in_len else 1.0
        offset = in_len / 2.0 * (1.0 - adjustment)
        return offset + (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        if out_len > 1:
            return (i + 0.5) / scale - 0.5
        return xp.zeros(out_len, dtype=np.float64)
    if mode == "align_corners":
        # the resized length is in_len * scale, fractional when it comes from a scale factor
        length = in_len * scale
        if out_len > 1 and length != 1.0:
            return i * ((in_len - 1) / (length - 1))
        return xp.zeros(out_len, dtype=np.float64)
    if mode == "asymmetric":
        return i / scale
    if mode == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if mode == "tf_crop_and_resize":
        if out_len > 1:
            return (roi_start * (in_len - 1)
                    + i * ((roi_end - roi_start) * (in_len - 1) / (out_len - 1)))
        return xp.full(out_len, 0.5 * (roi_start + roi_end) * (in_len - 1), dtype=np.float64)
    raise InputError(f"Resize: coordinate_transformation_mode {mode!r} is not supported "
                     f"(supported: {', '.join(_COORD_MODES)})")


def _nearest_index(xp, x, nearest_mode, scale):
    if nearest_mode == "round_prefer_floor":
        return xp.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return xp.floor(x + 0.5)
    if nearest_mode == "floor":
        return xp.floor(x)
    if nearest_mode == "ceil":
        return xp.ceil(x)
    if nearest_mode == "simple":  # Upsample / Resize-10
        return xp.ceil(x) if scale < 1 else xp.floor(x)
    raise InputError(f"Resize: nearest_mode {nearest_mode!r} is not supported "
                     f"(supported: {', '.join(_NEAREST_MODES)})")


def _cubic_kernel(xp, d, a):
    d = xp.abs(d)
    d2 = d * d
    d3 = d2 * d
    near = (a + 2.0) * d3 - (a + 3.0) * d2 + 1.0
    far = a * d3 - 5.0 * a * d2 + 8.0 * a * d - 4.0 * a
    return xp.where(d <= 1.0, near, xp.where(d < 2.0, far, 0.0))


def _axis_table(xp, mode, x, in_len, scale, *, nearest_mode, cubic_coeff_a, exclude_outside,
                antialias):
    """(indices, weights) of shape (out_len, taps); weights is None for nearest."""
    if mode == "nearest":
        idx = _nearest_index(xp, x, nearest_mode, scale)
        idx = xp.clip(idx, 0, max(in_len - 1, 0)).astype(np.int64)
        return idx[:, None], None
    x0 = xp.floor(x)
    ratio = x - x0
    stretch = antialias and scale < 1.0
    if mode == "linear":
        support = 1.0
    elif mode == "cubic":
        support = 2.0
    else:
        raise InputError(f"Resize: mode {mode!r} is not supported "
                         f"(supported: nearest, linear, cubic)")
    fscale = scale if stretch else 1.0
    start = int(math.floor(-support / fscale)) + 1
    offsets = xp.arange(start, 2 - start, dtype=np.float64)  # taps relative to floor(x)
    dist = (offsets[None, :] - ratio[:, None]) * fscale
    if mode == "linear":
        w = xp.clip(1.0 - xp.abs(dist), 0.0, 1.0)
    else:
        w = _cubic_kernel(xp, dist, cubic_coeff_a)
    idx = x0[:, None] + offsets[None, :]
    if exclude_outside:
        w = xp.where((idx >= 0) & (idx <= in_len - 1), w, 0.0)
    if exclude_outside or stretch:
        total = w.sum(axis=1, keepdims=True)
        w = w / xp.where(total == 0, 1.0, total)
    idx = xp.clip(idx, 0, max(in_len - 1, 0)).astype(np.int64)
    return idx, w


def _resample_axis(xp, y, axis, idx, w, valid, extrapolation_value):
    """Gather along ``axis`` with the (out, taps) tables and blend."""
    bshape = [1] * y.ndim
    bshape[axis] = idx.shape[0]
    if w is None:
        out = xp.take(y, idx[:, 0], axis=axis)
    else:
        out = None
        wc = w.astype(y.dtype)
        for k in range(idx.shape[1]):
            term = xp.take(y, idx[:, k], axis=axis)  # a fresh array: scaled in place
            term *= wc[:, k].reshape(bshape)
            if out is None:
                out = term
            else:
                out += term
    if valid is not None and not bool(valid.all()):
        fill = xp.asarray(extrapolation_value).astype(out.dtype)
        out = xp.where(valid.reshape(bshape), out, fill)
    return out


def _resize(x, out_shape, scales, *, mode, coord_mode, nearest_mode, cubic_coeff_a=-0.75,
            exclude_outside=0, extrapolation_value=0.0, antialias=0, roi=None):
    """Resample ``x`` to ``out_shape``; ``scales``/``roi`` are per-axis lists over all axes."""
    xp = xp_of(x)
    check_alloc(out_shape, x.dtype, what="Resize: the output")
    mode = _MODE_ALIASES.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise InputError(f"Resize: mode {mode!r} is not supported "
                         f"(supported: nearest, linear, cubic)")
    if mode != "nearest" and x.dtype.kind in "OUS":
        raise InputError(f"Resize: mode {mode!r} needs a numeric input, got {x.dtype}; "
                         f"use mode='nearest' for string tensors")
    out_dtype = x.dtype
    y = x if mode == "nearest" else x.astype(_compute_dtype(x))
    if any(d == 0 for d in out_shape):
        return xp.zeros(tuple(out_shape), dtype=out_dtype)
    if x.size == 0:
        raise ShapeError(f"Resize: cannot resize an empty input of shape {x.shape} "
                         f"to the non-empty shape {tuple(out_shape)}")
    # shrinking axes first (less data for the later passes); among equal ratios the innermost
    # axis first, as its element-wise gather is the slowest pass
    order = sorted(range(x.ndim), key=lambda a: (out_shape[a] / x.shape[a], -a))
    for axis in order:
        in_len, out_len = x.shape[axis], out_shape[axis]
        scale = scales[axis]
        start, end = roi[axis] if roi is not None else (0.0, 1.0)
        if out_len == in_len and coord_mode != "tf_crop_and_resize" and scale == 1.0:
            continue  # identity along this axis
        coords = _source_coords(xp, coord_mode, out_len, in_len, scale, start, end)
        valid = None
        if coord_mode == "tf_crop_and_resize":
            valid = (coords >= 0) & (coords <= in_len - 1)
        idx, w = _axis_table(xp, mode, coords, in_len, scale, nearest_mode=nearest_mode,
                             cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                             antialias=antialias)
        y = _resample_axis(xp, y, axis, idx, w, valid, extrapolation_value)
    if mode == "nearest":
        return y
    return _cast_result(xp, y, out_dtype)


def _norm_axes(axes, rank, op):
    if axes is None:
        return list(range(rank))
    return [norm_axis(a, rank, op, "axes value") for a in ints(axes)]


def _floor_size(in_len, scale):
    # float32 product as in the reference runtimes (10 * 0.7f == 7, not 6.999...)
    with np.errstate(over="ignore"):
        v = float(np.float32(in_len) * np.float32(scale))
    if not math.isfinite(v):
        raise InputError(f"Resize: scale {scale} gives a non-finite output size for an axis of "
                         f"length {in_len}")
    return int(math.floor(v))


# --------------------------------------------------------------------------------------------
# Resize / Upsample kernels


def _resize_by_scales(op, X, sc, mode):
    """Resize-10 and Upsample: one scale per axis, asymmetric coordinates, nearest by floor."""
    if len(sc) != X.ndim:
        raise ShapeError(f"{op}: scales has {len(sc)} values but the input has rank {X.ndim} "
                         f"(shape {X.shape}); give one scale per axis")
    if any(s <= 0 for s in sc):
        raise InputError(f"{op}: scales must be positive, got {sc}")
    out_shape = [_floor_size(d, s) for d, s in zip(X.shape, sc)]
    return _resize(X, out_shape, sc, mode=mode, coord_mode="asymmetric", nearest_mode="simple")


@kernel("Resize", since=10, category="shape", host_read_inputs=(1, 2, 3), settings=(1, 2, 3))
def resize_10(X, scales, *, mode):
    """Resize-10: scales input only, asymmetric coordinates, nearest by floor."""
    return _resize_by_scales("Resize", X, floats(scales), mode)


@kernel("Resize", since=11)
def resize(X, roi=None, scales=None, sizes=None, *, mode, coordinate_transformation_mode,
           nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value,
           antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    """Resize-11..19 (roi, sizes, coordinate modes, cubic, antialias, axes, aspect policy)."""
    rank = X.ndim
    axes_l = _norm_axes(axes, rank, "Resize")
    n = len(axes_l)
    coord = coordinate_transformation_mode
    if coord not in _COORD_MODES:
        raise InputError(f"Resize: coordinate_transformation_mode {coord!r} is not supported "
                         f"(supported: {', '.join(_COORD_MODES)})")
    sc_in = floats(scales) if scales is not None else []
    sz_in = ints(sizes) if sizes is not None else []
    if sc_in and sz_in:
        raise InputError("Resize: only one of 'scales' and 'sizes' may be given, got both "
                         f"(scales={sc_in}, sizes={sz_in})")
    if not sc_in and not sz_in:
        raise InputError("Resize: one of 'scales' and 'sizes' must be given (non-empty)")

    roi_pairs = None
    if coord == "tf_crop_and_resize":
        roi_v = floats(roi) if roi is not None else []
        roi_pairs = [(0.0, 1.0)] * rank
        if roi_v:
            if len(roi_v) == 2 * rank and n != rank:
                roi_v = [roi_v[a] for a in axes_l] + [roi_v[rank + a] for a in axes_l]
            if len(roi_v) != 2 * n:
                raise ShapeError(f"Resize: roi has {len(roi_v)} values, expected {2 * n} "
                                 f"(start and end for each of the axes {axes_l})")
            for i, a in enumerate(axes_l):
                roi_pairs[a] = (roi_v[i], roi_v[n + i])

    scale_all = [1.0] * rank
    out_shape = list(X.shape)
    if sc_in:
        if len(sc_in) != n:
            raise ShapeError(f"Resize: scales has {len(sc_in)} values, expected {n} "
                             f"(input shape {X.shape}, axes {axes_l})")
        if any(s <= 0 for s in sc_in):
            raise InputError(f"Resize: scales must be positive, got {sc_in}")
        for a, s in zip(axes_l, sc_in):
            scale_all[a] = s
            extent = 1.0
            if roi_pairs is not None:
                extent = roi_pairs[a][1] - roi_pairs[a][0]
            out_shape[a] = _floor_size(X.shape[a] * extent, s)
    else:
        if len(sz_in) != n:
            raise ShapeError(f"Resize: sizes has {len(sz_in)} values, expected {n} "
                             f"(input shape {X.shape}, axes {axes_l})")
        if any(s < 0 for s in sz_in):
            raise InputError(f"Resize: sizes must be non-negative, got {sz_in}")
        policy = keep_aspect_ratio_policy
        if policy == "stretch":
            for a, s in zip(axes_l, sz_in):
                out_shape[a] = s
                scale_all[a] = s / X.shape[a] if X.shape[a] else 1.0
        elif policy in ("not_larger", "not_smaller"):
            ratios = [s / X.shape[a] for a, s in zip(axes_l, sz_in) if X.shape[a]]
            common = (min if policy == "not_larger" else max)(ratios) if ratios else 1.0
            for a in axes_l:
                scale_all[a] = common
                out_shape[a] = int(math.floor(common * X.shape[a] + 0.5))
        else:
            raise InputError(f"Resize: keep_aspect_ratio_policy {policy!r} is not supported "
                             f"(supported: stretch, not_larger, not_smaller)")
    return _resize(X, out_shape, scale_all, mode=mode, coord_mode=coord,
                   nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a,
                   exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                   antialias=antialias, roi=roi_pairs)


@kernel("Upsample", since=7, category="shape", host_read_inputs=(1,), settings=(1,))
def upsample_7(X, *, mode, scales):
    """Upsample-7: scales attribute."""
    return _resize_by_scales("Upsample", X, floats(scales), mode)


@kernel("Upsample", since=9)
def upsample_9(X, scales, *, mode):
    """Upsample-9/10: scales input."""
    return _resize_by_scales("Upsample", X, floats(scales), mode)


# --------------------------------------------------------------------------------------------
# GridSample


def _reflect(xp, x, lo, hi):
    """Reflect coordinates into [lo, hi] (repeatedly, as a mirror at each border)."""
    span = hi - lo
    if span <= 0:
        return xp.zeros_like(x)
    d = xp.abs(x - lo)
    flips = xp.floor(d / span)
    extra = d - flips * span
    return xp.where(flips % 2 == 0, lo + extra, hi - extra)


def _grid_taps(xp, x, size, mode, padding_mode, align_corners):
    """Per-dimension taps: list of (index (N,P) int64, weight (N,P) or None, valid (N,P))."""
    lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)

    def pad_coord(c):
        if padding_mode == "border":
            return xp.clip(c, 0.0, size - 1.0)
        if padding_mode == "reflection":
            return xp.clip(_reflect(xp, c, lo, hi), 0.0, size - 1.0)
        return c

    def finish(i):
        valid = (i >= 0) & (i <= size - 1)
        return xp.clip(i, 0, size - 1).astype(np.int64), valid

    if mode == "nearest":
        i, valid = finish(xp.rint(pad_coord(x)))
        return [(i, None, valid)]
    if mode == "linear":
        x = pad_coord(x)
        x0 = xp.floor(x)
        r = x - x0
        taps = []
        for off, w in ((0.0, 1.0 - r), (1.0, r)):
            i, valid = finish(x0 + off)
            taps.append((i, w, valid))
        return taps
    # cubic: the padding is applied to every tap's position
    x0 = xp.floor(x)
    r = x - x0
    taps = []
    for off in (-1.0, 0.0, 1.0, 2.0):
        w = _cubic_kernel(xp, off - r, -0.75)
        i, valid = finish(pad_coord(x0 + off))
        taps.append((i, w, valid))
    return taps


def _grid_sample(X, grid, mode, padding_mode, align_corners, op):
    xp = xp_of(X, grid)
    mode = _MODE_ALIASES.get(mode, mode)
    if mode not in ("linear", "nearest", "cubic"):
        raise InputError(f"{op}: mode {mode!r} is not supported "
                         f"(supported: linear/bilinear, nearest, cubic/bicubic)")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise InputError(f"{op}: padding_mode {padding_mode!r} is not supported "
                         f"(supported: zeros, border, reflection)")
    r = X.ndim - 2
    if r < 1 or grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
        raise ShapeError(f"{op}: X of shape {X.shape} needs a grid of shape "
                         f"(N={X.shape[0] if X.ndim else '?'}, *out_spatial, {max(r, 0)}), "
                         f"got {grid.shape}")
    n, c = X.shape[:2]
    in_sp = X.shape[2:]
    out_sp = grid.shape[1:-1]
    p = int(np.prod(out_sp, dtype=np.int64))
    out_dtype = X.dtype
    cdt = _compute_dtype(X) if X.dtype.kind != "b" else np.dtype(np.float32)
    if X.size == 0 or p == 0:
        return xp.zeros((n, c) + tuple(out_sp), dtype=out_dtype)
    g = grid.reshape(n, p, r).astype(np.float64)
    per_dim = []
    for d in range(r):
        size = in_sp[d]
        gd = g[:, :, r - 1 - d]  # grid lists the innermost dimension first
        if align_corners:
            x = (gd + 1.0) / 2.0 * (size - 1)
        else:
            x = ((gd + 1.0) * size - 1.0) / 2.0
        per_dim.append(_grid_taps(xp, x, size, mode, padding_mode, align_corners))
    strides = [int(np.prod(in_sp[d + 1:], dtype=np.int64)) for d in range(r)]
    n_in = int(np.prod(in_sp, dtype=np.int64))
    # channels-last rows (N * spatial, C): every tap is one row gather of C contiguous values
    rows = xp.ascontiguousarray(xp.moveaxis(X.reshape(n, c, n_in), 1, 2)).reshape(n * n_in, c)
    if mode != "nearest":
        rows = rows.astype(cdt)
    base = (xp.arange(n, dtype=np.int64) * n_in)[:, None]
    out = None
    for combo in np.ndindex(*[len(t) for t in per_dim]):
        flat = base
        weight = None
        valid = None
        for d, k in enumerate(combo):
            i, w, v = per_dim[d][k]
            flat = flat + i * strides[d]
            valid = v if valid is None else valid & v
            if w is not None:
                weight = w if weight is None else weight * w
        vals = xp.take(rows, flat.reshape(-1), axis=0)  # (N * P, C), a fresh array
        if weight is None:  # nearest
            vals[~valid.reshape(-1)] = 0
            out = vals
        else:
            vals *= xp.where(valid, weight, 0.0).astype(cdt).reshape(-1, 1)
            if out is None:
                out = vals
            else:
                out += vals
    out = xp.ascontiguousarray(xp.moveaxis(out.reshape(n, p, c), 2, 1))
    out = out.reshape((n, c) + tuple(out_sp))
    if out.dtype != out_dtype:
        out = out.astype(out_dtype)  # integer outputs: computed in float, cast at the end
    return out


@kernel("GridSample", since=16)
def grid_sample_16(X, grid, *, align_corners, mode, padding_mode):
    """GridSample-16: 4-D input, modes bilinear/nearest/bicubic."""
    if X.ndim != 4:
        raise ShapeError(f"GridSample: opset 16 supports 4-D inputs (N, C, H, W) only, got shape "
                         f"{X.shape}; use opset 20 or later for other ranks")
    return _grid_sample(X, grid, mode, padding_mode, align_corners, "GridSample")


@kernel("GridSample", since=20)
def grid_sample(X, grid, *, align_corners, mode, padding_mode):
    """GridSample-20/22: N-D input, modes linear/nearest/cubic."""
    return _grid_sample(X, grid, mode, padding_mode, align_corners, "GridSample")


# --------------------------------------------------------------------------------------------
# AffineGrid


def _base_coords(xp, n, align_corners, dtype):
    if n <= 1:
        return xp.zeros(max(n, 0), dtype=dtype)
    i = xp.arange(n, dtype=np.float64)
    if align_corners:
        c = i * (2.0 / (n - 1)) - 1.0
    else:
        c = (2.0 * i + 1.0) / n - 1.0
    return c.astype(dtype)


@kernel("AffineGrid", since=20)
def affine_grid(theta, size, *, align_corners):
    """AffineGrid-20: sampling grid (N, H, W, 2) or (N, D, H, W, 3) from affine matrices."""
    xp = xp_of(theta)
    dims = ints(size)
    if len(dims) not in (4, 5):
        raise ShapeError(f"AffineGrid: size must hold 4 values (N, C, H, W) or 5 (N, C, D, H, W), "
                         f"got {dims}")
    r = len(dims) - 2
    nb = dims[0]
    if theta.shape != (nb, r, r + 1):
        raise ShapeError(f"AffineGrid: theta must have shape ({nb}, {r}, {r + 1}) for size {dims}, "
                         f"got {theta.shape}")
    cdt = np.float64 if theta.dtype == np.float64 else np.float32
    spatial = dims[2:]  # (H, W) or (D, H, W)
    # homogeneous base positions: x (innermost, W), y (H), [z (D)], 1
    axes = [_base_coords(xp, s, align_corners, cdt) for s in spatial]
    mesh = xp.meshgrid(*axes, indexing="ij")
    comps = [m for m in reversed(mesh)] + [xp.ones(tuple(spatial), dtype=cdt)]
    base = xp.stack(comps, axis=-1).reshape(-1, r + 1)  # (P, r+1)
    th = theta.astype(cdt)
    grid = xp.matmul(base[None, :, :], xp.swapaxes(th, 1, 2))  # (N, P, r)
    return grid.reshape((nb,) + tuple(spatial) + (r,)).astype(theta.dtype)
