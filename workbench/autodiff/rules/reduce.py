"""Gradients of the Reduce* family (axes as attribute or input, keepdims, noop_with_empty_axes)
and CumSum."""

from __future__ import annotations

import functools
import math

import onnx.defs

from workbench.autodiff.rules import gradient, ints


@functools.lru_cache(maxsize=256)
def _axes_is_input(op: str, opset: int) -> bool:
    """Whether ``axes`` is an input (not an attribute) of ``op`` at ``opset``: read from the
    ONNX schema (ReduceSum from 13, the other reductions from 18)."""
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except Exception:  # noqa: BLE001 - not an ONNX reduction: the opset-18 rule
        return opset >= 18
    return any(i.name == "axes" for i in schema.inputs)


def _axes(ctx, op, x, inputs, attrs):
    if _axes_is_input(op, ctx.opset):
        axes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else []
    else:
        axes = list(attrs.get("axes") or [])
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return ()
        return tuple(range(x.ndim))
    return tuple(sorted({a % x.ndim for a in axes}))


def _expand(xp, g, x, axes, keepdims):
    """``g`` (the reduced gradient) broadcast back to ``x``'s shape."""
    if not keepdims:
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
        g = g.reshape(shape)
    return xp.broadcast_to(g, x.shape)


def _reduce_rule(fn):
    """Rule from ``fn(xp, gb, x, yb, axes) -> gx`` with gb/yb broadcast to x's shape."""

    def rule(ctx, grads_out, inputs, outputs, *, keepdims=1, **attrs):
        xp = ctx.xp
        x = inputs[0]
        axes = _axes(ctx, ctx.op_type, x, inputs, attrs)
        gb = _expand(xp, grads_out[0], x, axes, keepdims)
        yb = _expand(xp, outputs[0], x, axes, keepdims)
        gx = fn(xp, gb, x, yb, axes)
        gx = xp.ascontiguousarray(xp.broadcast_to(gx, x.shape))
        return (gx,) + (None,) * (len(inputs) - 1)

    rule.__name__ = fn.__name__
    return rule


@gradient("ReduceSum")
@_reduce_rule
def reduce_sum_grad(xp, gb, x, yb, axes):
    return gb


@gradient("ReduceMean")
@_reduce_rule
def reduce_mean_grad(xp, gb, x, yb, axes):
    n = int(math.prod(x.shape[a] for a in axes)) if axes else 1
    return gb / n


@gradient("ReduceMax")
@gradient("ReduceMin")
@_reduce_rule
def reduce_max_grad(xp, gb, x, yb, axes):
    """To the extreme elements, split evenly between ties."""
    mask = (x == yb).astype(gb.dtype)
    count = mask.sum(axis=axes, keepdims=True) if axes else mask
    return gb * mask / count


@gradient("ReduceProd")
@_reduce_rule
def reduce_prod_grad(xp, gb, x, yb, axes):
    """Product of the other elements (exact also with zeros: via an exclusive product)."""
    if not axes:
        return gb
    zero = x == 0
    if not bool(zero.any()):
        return gb * yb / x
    # general path: move reduced axes last, flatten them, exclusive cumulative products
    keep = [a for a in range(x.ndim) if a not in axes]
    xt = x.transpose(keep + list(axes))
    flat = xt.reshape(xt.shape[:len(keep)] + (-1,))
    ones = xp.ones(flat.shape[:-1] + (1,), dtype=x.dtype)
    left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
    right = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(flat, -1)[..., :-1]], axis=-1),
                               axis=-1), -1)
    others = (left * right).reshape(xt.shape)
    inv = [0] * x.ndim
    for i, a in enumerate(keep + list(axes)):
        inv[a] = i
    return gb * others.transpose(inv)


@gradient("ReduceSumSquare")
@_reduce_rule
def reduce_sum_square_grad(xp, gb, x, yb, axes):
    return gb * 2 * x


@gradient("ReduceL1")
@_reduce_rule
def reduce_l1_grad(xp, gb, x, yb, axes):
    return gb * xp.sign(x)


@gradient("ReduceL2")
@_reduce_rule
def reduce_l2_grad(xp, gb, x, yb, axes):
    return gb * x / xp.where(yb == 0, 1, yb)


@gradient("ReduceLogSumExp")
@_reduce_rule
def reduce_log_sum_exp_grad(xp, gb, x, yb, axes):
    return gb * xp.exp(x - yb)


@gradient("ReduceLogSum")
@_reduce_rule
def reduce_log_sum_grad(xp, gb, x, yb, axes):
    return gb / xp.exp(yb)


@gradient("CumSum")
def cumsum_grad(ctx, grads_out, inputs, outputs, *, exclusive=0, reverse=0, **attrs):
    xp = ctx.xp
    g = grads_out[0]
    ax = int(ints(inputs[1])[0]) % g.ndim
    # the adjoint of a (reverse) cumulative sum is a cumulative sum in the other direction
    gf = g if reverse else xp.flip(g, ax)
    c = xp.cumsum(gf, axis=ax)
    if exclusive:
        sl = [slice(None)] * g.ndim
        sl[ax] = slice(0, -1)
        pad = [(0, 0)] * g.ndim
        pad[ax] = (1, 0)
        c = xp.pad(c[tuple(sl)], pad)
    gx = c if reverse else xp.flip(c, ax)
    return xp.ascontiguousarray(gx), None
