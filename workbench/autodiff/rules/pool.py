"""Gradients of MaxPool, AveragePool (pads, strides, dilations, ceil_mode, count_include_pad,
auto_pad) and GlobalAveragePool / GlobalMaxPool.

MaxPool sends each output's gradient to the first maximum of its window (row-major scan order,
as PyTorch does); AveragePool spreads it evenly over the window elements that the forward
counted.

MaxPool's CPU fast path (numpy, float inputs) finds the first maximum without a padded copy or
an argmax over window views: tap by tap in scan order, the input positions the tap sees (clipped
to the unpadded input) are compared with the forward output, and the output gradient goes to
the first tap that matches; blocks of (one image, some channels) that stay in L2 across the
taps run on the worker threads of ``ops.parallel``. Where some window has no element equal to
its output (NaN inputs), the plain path (``_max_pool_grad_plain``, the reference of the tests)
is taken. 2-D float32 runs on the compiled ``conv_grad.maxpool_dx`` when it is loaded (one pass
over the windows instead of five array operations per tap: ResNet-18's 3x3/2 pool at batch 8,
(8, 64, 112, 112), 141 ms -> see benchmarks/README.md): the same routing and the same sums in
the same order, bit for bit, except that an Inf/NaN output gradient of a window stays out of
the inputs its window did not route to (the numpy fast path adds ``0 * g`` there: NaN).
"""

from __future__ import annotations

import itertools
import math

import numpy as np  # the numpy-only fast path

from workbench import compiled
from workbench.autodiff.rules import gradient
from workbench.autodiff.rules.conv import _as_strided, _ksl, _tap_ranges, conv_pads
from workbench.ops.parallel import n_workers, run_blocks

_POOL_BLOCK = 1 << 18  # input + output elements of one MaxPool-gradient block


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
    if xp.__name__ == "numpy" and x.dtype.kind == "f" and g.dtype == x.dtype \
            and outputs[0].shape == g.shape:
        gx = _max_pool_grad_compiled(x, outputs[0], g, k, s, d, pb)
        if gx is None:
            gx = _max_pool_grad_cpu(x, outputs[0], g, k, s, d, pb)
        if gx is not None:
            return (gx,)
    return (_max_pool_grad_plain(xp, x, g, k, s, d, pb, pe),)


def _max_pool_grad_compiled(x, y, g, k, s, d, pb):
    """2-D float32: the compiled ``conv_grad.maxpool_dx`` (the same routing and sums as
    :func:`_max_pool_grad_cpu`, planes split over the worker threads); None when it is not
    loaded or does not apply, or some window has no element equal to its output."""
    if x.ndim != 4 or x.dtype != np.float32 or y.dtype != np.float32 or x.size == 0 \
            or g.size == 0:
        return None
    kern = compiled.kernel("conv_grad.maxpool_dx")
    if kern is None:
        return None
    n, c, h, w = (int(v) for v in x.shape)
    oh, ow = (int(v) for v in g.shape[2:])
    x, y, g = (np.ascontiguousarray(a) for a in (x, y, g))
    gx = np.empty(x.shape, np.float32)
    miss = np.zeros(1, np.int64)
    planes = n * c
    geo = (h, w, oh, ow, int(k[0]), int(k[1]), int(s[0]), int(s[1]), int(d[0]), int(d[1]),
           int(pb[0]), int(pb[1]))
    step = max(1, -(-planes // (4 * n_workers())))

    def work(chunk):
        for p0, p1 in chunk:
            kern(x, y, g, gx, miss, *geo, p0, p1)
    run_blocks(np, [(p, min(planes, p + step)) for p in range(0, planes, step)], work,
               x.size * int(k[0]) * int(k[1]))
    return None if miss[0] else gx


def _max_pool_grad_cpu(x, y, g, k, s, d, pb):
    """The first-maximum routing of MaxPool's gradient, tap by tap (see the module docstring);
    None when some window has no element equal to its output."""
    sp, out_sp = tuple(x.shape[2:]), tuple(g.shape[2:])
    n = x.shape[0]
    taps = [_tap_ranges(kk, s, d, pb, sp, out_sp)
            for kk in itertools.product(*[range(v) for v in k])]
    gx = np.empty(x.shape, dtype=g.dtype)
    missing = []
    c = x.shape[1]
    per_channel = int(math.prod(sp)) + int(math.prod(out_sp))
    # blocks of (one image, some channels) whose input and output stay in L2 over the taps
    cb = max(1, min(c, _POOL_BLOCK // max(1, per_channel)))
    jobs = [(i, c0, min(c, c0 + cb)) for i in range(n) for c0 in range(0, c, cb)]
    allsp = (slice(None),) * (1 + len(sp))

    def work(chunk):
        for i, c0, c1 in chunk:
            blk = (slice(i, i + 1), slice(c0, c1))
            gxb, xb, yb, gb = gx[blk], x[blk], y[blk], g[blk]
            gxb.fill(0)
            taken = np.zeros(yb.shape, dtype=bool)
            eq = np.empty(yb.shape, dtype=bool)
            part = np.empty(yb.shape, dtype=g.dtype)
            for rng in taps:
                if rng is None:
                    continue
                osl, isl = rng
                o = (slice(None), slice(None)) + osl
                i = (slice(None), slice(None)) + isl
                e, t, pt = eq[o], taken[o], part[o]
                np.equal(xb[i], yb[o], out=e)
                np.greater(e, t, out=e)          # equal and not taken by an earlier tap
                t |= e
                np.multiply(gb[o], e, out=pt)
                tgt = gxb[i]
                np.add(tgt, pt, out=tgt)
            if not taken[allsp].all():
                missing.append((i, c0))
    run_blocks(np, jobs, work, x.size * len(taps))
    return None if missing else gx


def _max_pool_grad_plain(xp, x, g, k, s, d, pb, pe):
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
    return gxpad[_crop(pb, sp)]


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
