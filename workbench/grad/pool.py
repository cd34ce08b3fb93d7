"""Gradients of MaxPool, AveragePool (pads, strides, dilations, ceil_mode, count_include_pad,
auto_pad) and GlobalAveragePool / GlobalMaxPool.

MaxPool sends each output's gradient to the first maximum of its window (row-major scan order,
as PyTorch does); AveragePool spreads it evenly over the window elements that the forward
counted.
"""

from __future__ import annotations

import itertools
import math

from workbench.grad import gradient
from workbench.grad.conv import _as_strided, _ksl, conv_pads


def _pool_geometry(x, y, attrs):
    nsp = x.ndim - 2
    k = list(attrs["kernel_shape"])
    s = list(attrs.get("strides") or [1] * nsp)
    d = list(attrs.get("dilations") or [1] * nsp)
    pb, pe = conv_pads(x.shape[2:], k, s, d, attrs.get("auto_pad", "NOTSET"),
                       attrs.get("pads"))
    return k, s, d, pb, pe


def _extent(sp, out_sp, k, s, d, pb, pe):
    """Padded size that holds every window (ceil_mode windows may overhang the pads)."""
    return [max(sp[i] + pb[i] + pe[i], (out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1)
            for i in range(len(sp))]


def _crop(pb, sp):
    return (slice(None), slice(None)) + tuple(slice(pb[i], pb[i] + sp[i]) for i in range(len(sp)))


@gradient("MaxPool")
def max_pool_grad(ctx, grads_out, inputs, outputs, **attrs):
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    if g is None:  # only the Indices output was used
        return (None,)
    k, s, d, pb, pe = _pool_geometry(x, outputs[0], attrs)
    sp, out_sp = x.shape[2:], g.shape[2:]
    nsp = len(sp)
    ext = _extent(sp, out_sp, k, s, d, pb, pe)
    if x.dtype.kind == "f":
        fill = -xp.inf
    else:
        fill = x.dtype.type(xp.iinfo(x.dtype).min)
    xpad = xp.full(x.shape[:2] + tuple(ext), fill, dtype=x.dtype)
    xpad[_crop(pb, sp)] = x
    st = xpad.strides
    win = _as_strided(xp, xpad, tuple(x.shape[:2]) + tuple(out_sp) + tuple(k),
                      st[:2] + tuple(st[2 + i] * s[i] for i in range(nsp))
                      + tuple(st[2 + i] * d[i] for i in range(nsp)))
    kp = int(math.prod(k))
    arg = win.reshape(tuple(x.shape[:2]) + tuple(out_sp) + (kp,)).argmax(axis=-1)
    gxpad = xp.zeros(xpad.shape, dtype=g.dtype)
    zero = xp.zeros((), dtype=g.dtype)
    for j, kk in enumerate(itertools.product(*[range(v) for v in k])):
        gxpad[(slice(None), slice(None)) + _ksl(kk, d, s, out_sp)] += xp.where(arg == j, g, zero)
    return (gxpad[_crop(pb, sp)],)


@gradient("AveragePool")
def average_pool_grad(ctx, grads_out, inputs, outputs, *, count_include_pad=0, **attrs):
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    k, s, d, pb, pe = _pool_geometry(x, outputs[0], attrs)
    sp, out_sp = x.shape[2:], g.shape[2:]
    ext = _extent(sp, out_sp, k, s, d, pb, pe)
    # which padded positions the forward counts: the input, plus the pads when asked
    valid = xp.zeros(tuple(ext), dtype=g.dtype)
    if count_include_pad:
        valid[tuple(slice(0, sp[i] + pb[i] + pe[i]) for i in range(len(sp)))] = 1
    else:
        valid[tuple(slice(pb[i], pb[i] + sp[i]) for i in range(len(sp)))] = 1
    kidx = list(itertools.product(*[range(v) for v in k]))
    count = xp.zeros(tuple(out_sp), dtype=g.dtype)
    for kk in kidx:
        count += valid[_ksl(kk, d, s, out_sp)]
    gc = g / xp.maximum(count, 1)
    gxpad = xp.zeros(x.shape[:2] + tuple(ext), dtype=g.dtype)
    for kk in kidx:
        sl = _ksl(kk, d, s, out_sp)
        gxpad[(slice(None), slice(None)) + sl] += gc * valid[sl]
    return (gxpad[_crop(pb, sp)],)


@gradient("GlobalAveragePool")
def global_average_pool_grad(ctx, grads_out, inputs, outputs, **attrs):
    x = inputs[0]
    g = grads_out[0]
    n = int(math.prod(x.shape[2:]))
    return (ctx.xp.broadcast_to(g / n, x.shape).copy(),)


@gradient("GlobalMaxPool")
def global_max_pool_grad(ctx, grads_out, inputs, outputs, **attrs):
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    arg = flat.argmax(axis=-1)
    onehot = xp.arange(flat.shape[-1]) == arg[..., None]
    gx = onehot * g.reshape(x.shape[0], x.shape[1], 1)
    return (gx.astype(g.dtype).reshape(x.shape),)
