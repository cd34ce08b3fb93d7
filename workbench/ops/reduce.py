"""Reductions: Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK.

Axes arrive as an attribute in the older opsets (ReduceSum < 13, the other Reduce* < 18) and as
an optional int64 input afterwards. With no axes (or an empty axes input) the reduction runs over
all axes, unless ``noop_with_empty_axes`` is set, in which case it runs over the empty set of axes
(numpy's ``axis=()``): only the element-wise steps of a composite reduction remain (ReduceL1 -> abs,
ReduceSumSquare -> square, ReduceLogSum -> log...).

A reduction over an empty set of values gives the identity of the reduction: 0 for sums, 1 for
products, -inf (or the dtype's minimum, False for bool) for max, +inf (dtype maximum, True) for
min, -inf for ReduceLogSum(Exp).
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops._common import ints, norm_axis, prod, stable_argsort, widen_half
from workbench.ops.registry import kernel


def _reduce_axes(op, data, axes, noop_with_empty_axes):
    """The tuple of axes to reduce (possibly empty = no reduction)."""
    axes = ints(axes)
    if not axes:
        return () if noop_with_empty_axes else tuple(range(data.ndim))
    return tuple(sorted({norm_axis(a, data.ndim, op, "axes value") for a in axes}))


def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _dtype_extreme(dtype, lowest: bool):
    """-inf/+inf for floats, the dtype min/max for ints, False/True for bool."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return not lowest
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return info.min if lowest else info.max
    return -np.inf if lowest else np.inf


def _finish(xp, res, dtype):
    return xp.asarray(res).astype(dtype, copy=False)


def _xsum(xp, w, ax, keepdims, dtype=None):
    """``sum`` over ``ax``; over no axes it is the identity (numpy's ``axis=()``)."""
    if not ax:
        return w if dtype is None else w.astype(dtype, copy=False)
    return xp.sum(w, axis=ax, keepdims=keepdims, dtype=dtype)


def _float_work(x):
    """x in a float type fit for accumulation: low floats -> float32, ints -> float64."""
    w = widen_half(x)
    return w.astype(np.float64) if w.dtype.kind in "iub" else w


def _reduce(op, data, axes, keepdims, noop_with_empty_axes, how):
    """Shared driver: ``how(xp, x, axes_tuple, keepdims)`` does the reduction proper."""
    xp = xp_of(data)
    ax = _reduce_axes(op, data, axes, noop_with_empty_axes)
    if data.size == 0:   # an empty input's output may still be huge: [2, 0, 4, 2**31]
        check_alloc(_reduced_shape(data.shape, ax, bool(keepdims)), np.float64,
                    what=f"{op}: the output")
    elif ax and xp is np and not data.flags.c_contiguous:
        flat = _memory_order(data, ax)
        if flat is not None:
            y = how(xp, flat[0], flat[1], False)
            return y.reshape(_reduced_shape(data.shape, ax, bool(keepdims)))
    return how(xp, data, ax, bool(keepdims))


def _memory_order(data, ax):
    """``(x2, ax2)``: a strided view (the layout pass' NHWC -> NCHW transposes) as the
    contiguous array it views, adjacent reduced / kept axes merged, when that keeps the kept
    axes in their order; else None. numpy reducing the view walks memory with large strides
    (0.7 ms for a [1, 1024, 7, 7] mean read just after it was written, against 0.03 ms
    contiguous)."""
    order = sorted(range(data.ndim), key=lambda a: -data.strides[a] if data.shape[a] > 1
                   else 0)
    order = [a for a in order if data.shape[a] > 1]
    kept = [a for a in order if a not in ax]
    if kept != sorted(kept) or not order:
        return None
    x = data.transpose(order + [a for a in range(data.ndim) if data.shape[a] == 1])
    if not x.flags.c_contiguous:
        return None
    shape, red = [], []
    for a in order:
        r = a in ax
        if red and red[-1] == r:
            shape[-1] *= data.shape[a]
        else:
            shape.append(data.shape[a])
            red.append(r)
    if not any(red):
        return None
    x = x.reshape(shape)
    return x, tuple(i for i, r in enumerate(red) if r)


def _sum_core(xp, x, ax, keepdims):
    w = widen_half(x)
    return _finish(xp, _xsum(xp, w, ax, keepdims, w.dtype), x.dtype)


def _prod_core(xp, x, ax, keepdims):
    if not ax:
        return x
    w = widen_half(x)
    return _finish(xp, xp.prod(w, axis=ax, keepdims=keepdims, dtype=w.dtype), x.dtype)


def _mean_core(xp, x, ax, keepdims):
    w = _float_work(x)
    n = prod(x.shape[a] for a in ax)
    with np.errstate(divide="ignore", invalid="ignore"):  # mean of nothing: NaN, as numpy
        return _finish(xp, _xsum(xp, w, ax, keepdims) / w.dtype.type(n), x.dtype)


def _extreme_core(is_max):
    def core(xp, x, ax, keepdims):
        if not ax:
            return x
        if any(x.shape[a] == 0 for a in ax):
            shape = _reduced_shape(x.shape, ax, keepdims)
            return xp.full(shape, _dtype_extreme(x.dtype, lowest=is_max), dtype=x.dtype)
        if x.dtype.kind == "b":
            fn = xp.any if is_max else xp.all
        else:
            fn = xp.max if is_max else xp.min
        return _finish(xp, fn(x, axis=ax, keepdims=keepdims), x.dtype)

    return core


def _l1_core(xp, x, ax, keepdims):
    return _sum_core(xp, xp.abs(x), ax, keepdims)


def _sum_square_core(xp, x, ax, keepdims):
    w = widen_half(x)
    return _finish(xp, _xsum(xp, w * w, ax, keepdims, w.dtype), x.dtype)


def _l2_core(xp, x, ax, keepdims):
    w = _float_work(x)
    return _finish(xp, xp.sqrt(_xsum(xp, w * w, ax, keepdims)), x.dtype)


def _log_sum_core(xp, x, ax, keepdims):
    w = _float_work(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _finish(xp, xp.log(_xsum(xp, w, ax, keepdims)), x.dtype)


def _log_sum_exp_core(xp, x, ax, keepdims):
    w = _float_work(x)
    if not ax:
        return _finish(xp, w, x.dtype)
    if any(x.shape[a] == 0 for a in ax):
        shape = _reduced_shape(x.shape, ax, keepdims)
        return xp.full(shape, -np.inf, dtype=x.dtype)
    # stable: log(sum(exp(x - m))) + m with m the (finite) maximum
    m = xp.max(w, axis=ax, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = xp.log(xp.sum(xp.exp(w - m), axis=ax, keepdims=True)) + m
    if not keepdims:
        s = s.reshape(_reduced_shape(x.shape, ax, False))
    return _finish(xp, s, x.dtype)


_CORES = {
    "ReduceSum": _sum_core,
    "ReduceMean": _mean_core,
    "ReduceMax": _extreme_core(True),
    "ReduceMin": _extreme_core(False),
    "ReduceProd": _prod_core,
    "ReduceL1": _l1_core,
    "ReduceL2": _l2_core,
    "ReduceLogSum": _log_sum_core,
    "ReduceLogSumExp": _log_sum_exp_core,
    "ReduceSumSquare": _sum_square_core,
}


def _make_reduce(op: str, axes_input_since: int, host_shape_math: bool = False):
    core = _CORES[op]
    fname = "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")

    def reduce_axes_attr(data, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        return _reduce(op, data, axes, keepdims, noop_with_empty_axes, core)

    def reduce_axes_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(op, data, axes, keepdims, noop_with_empty_axes, core)

    reduce_axes_attr.__name__ = reduce_axes_attr.__qualname__ = f"{fname}_axes_attr"
    reduce_axes_input.__name__ = reduce_axes_input.__qualname__ = f"{fname}_axes_input"
    reduce_axes_attr.__doc__ = f"{op}-1..{axes_input_since - 1}: axes as an attribute."
    reduce_axes_input.__doc__ = f"{op}-{axes_input_since}+: axes as an optional int64 input."
    kernel(op, since=1, category="reduction", host_read_inputs=(1,),
           host_shape_math=host_shape_math)(reduce_axes_attr)
    kernel(op, since=axes_input_since)(reduce_axes_input)
    return reduce_axes_attr, reduce_axes_input


reduce_sum_axes_attr, reduce_sum_axes_input = _make_reduce("ReduceSum", 13, host_shape_math=True)
reduce_mean_axes_attr, reduce_mean_axes_input = _make_reduce("ReduceMean", 18)
reduce_max_axes_attr, reduce_max_axes_input = _make_reduce("ReduceMax", 18, host_shape_math=True)
reduce_min_axes_attr, reduce_min_axes_input = _make_reduce("ReduceMin", 18, host_shape_math=True)
reduce_prod_axes_attr, reduce_prod_axes_input = _make_reduce("ReduceProd", 18, host_shape_math=True)
reduce_l1_axes_attr, reduce_l1_axes_input = _make_reduce("ReduceL1", 18)
reduce_l2_axes_attr, reduce_l2_axes_input = _make_reduce("ReduceL2", 18)
reduce_log_sum_axes_attr, reduce_log_sum_axes_input = _make_reduce("ReduceLogSum", 18)
reduce_log_sum_exp_axes_attr, reduce_log_sum_exp_axes_input = _make_reduce("ReduceLogSumExp", 18)
reduce_sum_square_axes_attr, reduce_sum_square_axes_input = _make_reduce("ReduceSumSquare", 18)


# ArgMax / ArgMin ---------------------------------------------------------------------------------

def _arg_extreme(op, data, axis, keepdims, select_last_index, is_max):
    xp = xp_of(data)
    axis = norm_axis(int(axis), data.ndim, op)
    n = data.shape[axis]
    if n == 0:
        raise ShapeError(f"{op}: cannot take the arg{'max' if is_max else 'min'} over axis "
                         f"{axis} of size 0 (input shape {tuple(data.shape)})")
    x = data.astype(np.uint8) if data.dtype.kind == "b" else data
    fn = xp.argmax if is_max else xp.argmin
    if select_last_index:
        idx = (n - 1) - fn(xp.flip(x, axis=axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = xp.asarray(idx).astype(np.int64, copy=False)
    if keepdims:
        idx = xp.expand_dims(idx, axis)
    return idx


@kernel("ArgMax", since=1, category="reduction")
def arg_max(data, *, axis=0, keepdims=1, select_last_index=0):
    """Indices (int64) of the maxima along ``axis``; ties give the first (or last) index."""
    return _arg_extreme("ArgMax", data, axis, keepdims, select_last_index, True)


@kernel("ArgMin", since=1, category="reduction")
def arg_min(data, *, axis=0, keepdims=1, select_last_index=0):
    """Indices (int64) of the minima along ``axis``; ties give the first (or last) index."""
    return _arg_extreme("ArgMin", data, axis, keepdims, select_last_index, False)


# CumSum / CumProd --------------------------------------------------------------------------------

def _scalar_axis(op, axis) -> int:
    vals = ints(axis)
    if len(vals) != 1:
        raise InputError(f"{op}: input 'axis' must hold exactly one integer, got {vals}")
    return vals[0]


def _cumulative(op, x, axis, exclusive, reverse, is_sum):
    xp = xp_of(x)
    ax = norm_axis(_scalar_axis(op, axis), x.ndim, op)
    w = widen_half(x)
    if reverse:
        w = xp.flip(w, axis=ax)
    if exclusive and w.shape[ax]:
        # shift by one along the axis, the identity (0 or 1) entering first
        pad_shape = list(w.shape)
        pad_shape[ax] = 1
        head = [slice(None)] * w.ndim
        head[ax] = slice(0, w.shape[ax] - 1)
        fill = xp.full(pad_shape, 0 if is_sum else 1, dtype=w.dtype)
        w = xp.concatenate([fill, w[tuple(head)]], axis=ax)
    acc = xp.cumsum if is_sum else xp.cumprod
    out = acc(w, axis=ax, dtype=w.dtype)
    if reverse:
        out = xp.flip(out, axis=ax)
    return out.astype(x.dtype, copy=False)


@kernel("CumSum", since=11, category="reduction", host_read_inputs=(1,))
def cum_sum(x, axis, *, exclusive=0, reverse=0):
    """Cumulative sum along ``axis`` (a 0-D or 1-element int tensor)."""
    return _cumulative("CumSum", x, axis, exclusive, reverse, True)


@kernel("CumProd", since=26)
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    """Cumulative product along ``axis`` (a 0-D or 1-element int tensor)."""
    return _cumulative("CumProd", x, axis, exclusive, reverse, False)


# TopK --------------------------------------------------------------------------------------------

def _top_k(x, k, axis, largest):
    xp = xp_of(x)
    if x.ndim == 0:
        raise ShapeError("TopK: input X must have rank >= 1, got a scalar")
    ax = norm_axis(int(axis), x.ndim, "TopK")
    n = x.shape[ax]
    if k < 0 or k > n:
        raise ShapeError(f"TopK: k={k} must be in [0, {n}] (size of axis {ax} of input shape "
                         f"{tuple(x.shape)})")
    xs = x.astype(np.float32) if x.dtype.name == "bfloat16" else x
    if largest:
        # descending order, ties by lower index first: a stable ascending sort of the reversed
        # axis, read backwards
        order = stable_argsort(xp, xp.flip(xs, axis=ax), ax)
        order = (n - 1) - xp.flip(order, axis=ax)
    else:
        order = stable_argsort(xp, xs, ax)
    take = [slice(None)] * x.ndim
    take[ax] = slice(0, k)
    idx = order[tuple(take)].astype(np.int64, copy=False)
    values = xp.take_along_axis(x, idx, axis=ax)
    return values, idx


def _k_of(k) -> int:
    vals = ints(k)
    if len(vals) != 1:
        raise InputError(f"TopK: input 'K' must hold exactly one integer, got {vals}")
    return vals[0]


@kernel("TopK", since=1, category="reduction", host_read_inputs=(1,))
def top_k_attr(x, *, k, axis=-1):
    """TopK-1..9: ``k`` is an attribute; the largest elements, sorted."""
    return _top_k(x, int(k), axis, True)


@kernel("TopK", since=10)
def top_k(x, k, *, axis=-1, largest=1, sorted=1):
    """TopK-10+: ``K`` is an input; ``largest``/``sorted`` attributes from opset 11.

    The result is always sorted (allowed when ``sorted=0``); equal values keep index order.
    """
    return _top_k(x, _k_of(k), axis, largest)
