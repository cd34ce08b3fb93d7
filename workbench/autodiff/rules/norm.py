"""Normalisation: the training-mode forward of BatchNormalization, and the gradients of
BatchNormalization (inference and training form, opset-7 ``spatial`` included),
LayerNormalization, InstanceNormalization and GroupNormalization.

Training-mode BatchNormalization follows the ONNX spec (opset 15): the output is normalised with
the batch mean and the *biased* batch variance, and the running statistics become
``running * momentum + batch * (1 - momentum)``.

On numpy (float32/float64, per-channel statistics over the batch and spatial axes) its forward
and backward run cache-blocked on the worker threads of ``ops.parallel``: blocks of (one image,
some channels) that fit in L2; a first pass computes per-block sums (the mean and the squared
deviations from the block's own mean, combined over the batch with Chan's formula, in float64),
a second pass normalises (or forms dx) block by block. That reads the input twice and writes
the output once, with no full-size temporaries. ``_bn_train_plain`` / ``_bn_train_grad_plain``
are the reference paths the tests compare them with.

float32, C-contiguous, per-channel: the compiled kernels of ``compiled/kernels/norm_train.py``
when they are loaded (per-row statistics in float64 combined here with the same formula, one
normalising pass; per-row sums then one fused dx pass), else the numpy paths above.
LayerNormalization's gradient (float32, a scale of the normalised axes' shape) likewise runs
``norm_train.ln_grad`` when loaded (``compiled.disabled()`` keeps everything on numpy).
"""

from __future__ import annotations

import math

import numpy as np  # dtype constants only

from workbench import compiled
from workbench.arrays import xp_of
from workbench.autodiff.rules import gradient, unbroadcast
from workbench.ops._common import widen_half
from workbench.ops.parallel import n_workers, run_blocks
from workbench.ops.registry import kernel

_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_BN_BLOCK = 1 << 16  # elements of one (image, channels) block: in L2 across the block's passes
_BN_MIN = 1 << 18    # below this many elements the whole tensor stays in cache: plain path


def _bn_axes_shape(x, param, spatial=1):
    """(reduction axes, broadcast shape of the per-channel parameters)."""
    if spatial == 0 and param.ndim > 1:
        return (0,), (1,) + tuple(param.shape)
    if spatial == 0:  # per-activation stats given flat
        return (0,), (1,) + tuple(x.shape[1:])
    axes = (0,) + tuple(range(2, x.ndim))
    return axes, (1, x.shape[1]) + (1,) * (x.ndim - 2)


@kernel("BatchNormalization", since=1, train=True, state_outputs={1: 3, 2: 4})
def batchnorm_train(x, scale, bias, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                    training_mode=1, spatial=1, **unused):
    """BatchNormalization in training mode (the op's registered training form): (Y,
    running_mean, running_var), followed by the batch mean and 1/std (kept for the gradient
    rule; not node outputs). Outputs 1 and 2 are written back into inputs 3 and 4."""
    if _bn_compiled_ok(x, scale, spatial):
        got = _bn_train_compiled(x, scale, bias, input_mean, input_var, epsilon, momentum)
        if got is not None:
            return got
    if _bn_fast(x, scale, spatial):
        return _bn_train_cpu(x, scale, bias, input_mean, input_var, epsilon, momentum)
    return _bn_train_plain(x, scale, bias, input_mean, input_var, epsilon, momentum, spatial)


def _bn_fast(x, scale, spatial) -> bool:
    """Whether the cache-blocked numpy path applies: per-channel statistics over the batch
    and at least 16 spatial positions per channel (below that, blocks are too small for their
    Python overhead), float32/64, contiguous, large enough to leave the cache."""
    return (type(x) is np.ndarray and x.dtype in _FAST_DTYPES and x.ndim >= 3
            and spatial == 1 and scale.ndim == 1 and x.size >= 16 * x.shape[0] * x.shape[1]
            and x.size >= _BN_MIN and x.flags.c_contiguous)


def _bn_compiled_ok(x, scale, spatial) -> bool:
    """Whether the compiled kernels (``norm_train``) may take this BatchNormalization:
    float32, contiguous, per-channel statistics over the batch and spatial axes."""
    return (type(x) is np.ndarray and x.dtype == np.float32 and x.ndim >= 3 and spatial == 1
            and scale.ndim == 1 and x.size > 0 and x.flags.c_contiguous)


def _bn_rows(fn, n, c, s):
    """Call ``fn(r0, r1)`` over the ``n * c`` rows of S elements, split over the worker
    threads (a few chunks per thread; small tensors on the calling thread)."""
    rows = n * c
    step = max(1, -(-rows // (4 * n_workers())), (1 << 14) // max(1, s))
    jobs = [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]

    def work(chunk):
        for r0, r1 in chunk:
            fn(r0, r1)
    run_blocks(np, jobs, work, 3 * rows * s)


def _bn_train_compiled(x, scale, bias, input_mean, input_var, epsilon, momentum):
    """The training forward on the compiled kernels (see ``compiled/kernels/norm_train``):
    per-row statistics, combined per channel here (Chan's formula, float64), then one
    normalising pass. None when the kernels are not loaded (the numpy path runs)."""
    k_stats = compiled.kernel("norm_train.bn_stats")
    k_norm = compiled.kernel("norm_train.bn_norm")
    if k_stats is None or k_norm is None:
        return None
    n, c = x.shape[:2]
    s = x.size // (n * c)
    rows = n * c
    part_mean = np.empty(rows, dtype=np.float64)
    part_m2 = np.empty(rows, dtype=np.float64)
    raw, ptr = k_stats.raw, compiled.data_pointer
    px, pm, pq = ptr(x), ptr(part_mean), ptr(part_m2)
    _bn_rows(lambda r0, r1: raw(px, pm, pq, rows, c, s, r0, r1), n, c, s)
    part_mean = part_mean.reshape(n, c)
    mean64 = part_mean.mean(axis=0)
    m2 = part_m2.reshape(n, c).sum(axis=0) + s * np.square(part_mean - mean64).sum(axis=0)
    var64 = m2 / (n * s)
    inv64 = 1.0 / np.sqrt(var64 + epsilon)
    mean = mean64.astype(np.float32)
    a = (inv64 * np.asarray(scale, dtype=np.float64).reshape(c)).astype(np.float32)
    b = np.ascontiguousarray(np.asarray(bias).reshape(c), dtype=np.float32)
    y = np.empty_like(x)
    raw = k_norm.raw
    pmean, pa, pb, py = ptr(mean), ptr(a), ptr(b), ptr(y)
    _bn_rows(lambda r0, r1: raw(px, pmean, pa, pb, py, rows, c, s, r0, r1), n, c, s)
    m = np.float32(momentum)
    run_mean = (input_mean * m + mean.astype(input_mean.dtype) * (1 - m)).astype(
        input_mean.dtype)
    run_var = (input_var * m + var64.astype(input_var.dtype) * (1 - m)).astype(input_var.dtype)
    return (y, run_mean.reshape(input_mean.shape), run_var.reshape(input_var.shape), mean,
            inv64.astype(np.float32))


def _bn_train_grad_compiled(x, g, bm, inv, scale, bias, need):
    """The training backward on the compiled kernels: per-row sums of g and g (x - mean),
    combined per channel, then dx = ca g + cb (x - mean) + cc in one pass. None when the
    kernels are not loaded."""
    k_sums = compiled.kernel("norm_train.bn_grad_sums")
    k_dx = compiled.kernel("norm_train.bn_grad_dx")
    if k_sums is None or k_dx is None:
        return None
    n, c = x.shape[:2]
    s = x.size // (n * c)
    rows, m = n * c, x.size // c
    mean = np.ascontiguousarray(np.asarray(bm).reshape(c), dtype=np.float32)
    part_g = np.empty(rows, dtype=np.float64)
    part_gd = np.empty(rows, dtype=np.float64)
    raw, ptr = k_sums.raw, compiled.data_pointer
    px, pg, pmean = ptr(x), ptr(g), ptr(mean)
    pa, pb = ptr(part_g), ptr(part_gd)
    _bn_rows(lambda r0, r1: raw(px, pg, pmean, pa, pb, rows, c, s, r0, r1), n, c, s)
    iv = np.asarray(inv, dtype=np.float64).reshape(c)
    sum_g = part_g.reshape(n, c).sum(axis=0)
    sum_gxhat = iv * part_gd.reshape(n, c).sum(axis=0)     # = dL/dscale
    gx = None
    if need[0]:
        k = np.asarray(scale, dtype=np.float64).reshape(c) * iv / m
        ca = (k * m).astype(np.float32)                    # times g
        cb = (-k * iv * sum_gxhat).astype(np.float32)      # times (x - mean)
        cc = (-k * sum_g).astype(np.float32)               # constant
        gx = np.empty_like(x)
        raw = k_dx.raw
        pca, pcb, pcc, pdx = ptr(ca), ptr(cb), ptr(cc), ptr(gx)
        _bn_rows(lambda r0, r1: raw(px, pg, pmean, pca, pcb, pcc, pdx, rows, c, s, r0, r1),
                 n, c, s)
    gs = sum_gxhat.astype(scale.dtype).reshape(scale.shape) if need[1] else None
    gb = sum_g.astype(bias.dtype).reshape(bias.shape) if need[2] else None
    return gx, gs, gb, None, None


def _bn_jobs(n, c, s):
    cb = max(1, min(c, _BN_BLOCK // max(1, s)))
    return [(i, c0, min(c, c0 + cb)) for i in range(n) for c0 in range(0, c, cb)]


def _bn_train_cpu(x, scale, bias, input_mean, input_var, epsilon, momentum):
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1)
    s = x3.shape[2]
    dt = x.dtype
    jobs = _bn_jobs(n, c, s)
    part_mean = np.empty((n, c), dtype=np.float64)
    part_m2 = np.empty((n, c), dtype=np.float64)

    def stats(chunk):
        for i, c0, c1 in chunk:
            xb = x3[i, c0:c1]
            mu = xb.mean(axis=1)
            dev = xb - mu[:, None]
            np.square(dev, out=dev)
            part_mean[i, c0:c1] = mu
            part_m2[i, c0:c1] = dev.sum(axis=1)
    run_blocks(np, jobs, stats, 2 * x.size)
    mean64 = part_mean.mean(axis=0)
    m2 = part_m2.sum(axis=0) + s * np.square(part_mean - mean64).sum(axis=0)
    var64 = m2 / (n * s)
    inv64 = 1.0 / np.sqrt(var64 + epsilon)
    mean = mean64.astype(dt)
    a = (inv64 * np.asarray(scale, dtype=np.float64).reshape(c)).astype(dt)
    b = np.asarray(bias).reshape(c).astype(dt, copy=False)
    y = np.empty_like(x)
    y3 = y.reshape(n, c, s)

    def normalise(chunk):
        for i, c0, c1 in chunk:
            yb = y3[i, c0:c1]
            np.subtract(x3[i, c0:c1], mean[c0:c1, None], out=yb)
            yb *= a[c0:c1, None]
            yb += b[c0:c1, None]
    run_blocks(np, jobs, normalise, 3 * x.size)
    m = dt.type(momentum)
    run_mean = (input_mean * m + mean.astype(input_mean.dtype) * (1 - m)).astype(
        input_mean.dtype)
    run_var = (input_var * m + var64.astype(input_var.dtype) * (1 - m)).astype(input_var.dtype)
    return (y, run_mean.reshape(input_mean.shape), run_var.reshape(input_var.shape), mean,
            inv64.astype(dt))


def _bn_train_plain(x, scale, bias, input_mean, input_var, epsilon, momentum, spatial):
    axes, bshape = _bn_axes_shape(x, scale, spatial)
    xa = widen_half(x)
    mean = xa.mean(axis=axes)
    xc = xa - mean.reshape(bshape)
    var = (xc * xc).mean(axis=axes)
    inv = 1.0 / ((var + epsilon) ** 0.5)
    y = (xc * (inv.reshape(bshape) * widen_half(scale).reshape(bshape))
         + widen_half(bias).reshape(bshape))
    m = x.dtype.type(momentum) if x.dtype.kind == "f" else momentum
    run_mean = (input_mean * m + mean.astype(input_mean.dtype) * (1 - m)).astype(
        input_mean.dtype)
    run_var = (input_var * m + var.astype(input_var.dtype) * (1 - m)).astype(input_var.dtype)
    return (y.astype(x.dtype, copy=False), run_mean.reshape(input_mean.shape),
            run_var.reshape(input_var.shape), mean, inv)


def _bn_train_grad_blocked(x, g, bm, inv, scale, bias, need):
    """Training BatchNorm backward, cache-blocked and threaded (see the module docstring):
    pass 1 sums g and g * (x - mean) per block, pass 2 forms dx = k m g - k sum(g) -
    k inv sum(g xhat) (x - mean) block by block, k = scale * inv / m."""
    n, c = x.shape[:2]
    x3, g3 = x.reshape(n, c, -1), g.reshape(n, c, -1)
    s = x3.shape[2]
    m = n * s
    dt = x.dtype
    jobs = _bn_jobs(n, c, s)
    mean = np.asarray(bm).reshape(c).astype(dt, copy=False)
    part_g = np.empty((n, c), dtype=np.float64)
    part_gd = np.empty((n, c), dtype=np.float64)

    def sums(chunk):
        for i, c0, c1 in chunk:
            gb = g3[i, c0:c1]
            dev = x3[i, c0:c1] - mean[c0:c1, None]
            dev *= gb
            part_g[i, c0:c1] = gb.sum(axis=1)
            part_gd[i, c0:c1] = dev.sum(axis=1)
    run_blocks(np, jobs, sums, 3 * x.size)
    iv = np.asarray(inv, dtype=np.float64).reshape(c)
    sum_g = part_g.sum(axis=0)
    sum_gxhat = iv * part_gd.sum(axis=0)                  # = dL/dscale
    gx = None
    if need[0]:
        k = np.asarray(scale, dtype=np.float64).reshape(c) * iv / m
        ca = (k * m).astype(dt)                           # times g
        cb = (-k * iv * sum_gxhat).astype(dt)             # times (x - mean)
        cc = (-k * sum_g).astype(dt)                      # constant
        gx = np.empty_like(g)
        gx3 = gx.reshape(n, c, s)

        def dx(chunk):
            for i, c0, c1 in chunk:
                out = gx3[i, c0:c1]
                dev = x3[i, c0:c1] - mean[c0:c1, None]
                dev *= cb[c0:c1, None]
                np.multiply(g3[i, c0:c1], ca[c0:c1, None], out=out)
                out += dev
                out += cc[c0:c1, None]
        run_blocks(np, jobs, dx, 5 * x.size)
    gs = sum_gxhat.astype(scale.dtype).reshape(scale.shape) if need[1] else None
    gb = sum_g.astype(bias.dtype).reshape(bias.shape) if need[2] else None
    return gx, gs, gb, None, None


def _bn_train_grad_cpu(x, g, bm, inv, sc, scale, bias, need):
    """Training BatchNorm backward on numpy in few passes: the two per-channel sums (one
    ``einsum`` without temporaries for sum(g * x)), then dx = A g + B x + C with per-channel
    A, B, C (float64 coefficients)."""
    n, c = x.shape[:2]
    m = x.size // max(c, 1)
    g3, x3 = g.reshape(n, c, -1), x.reshape(n, c, -1)
    sum_g = g3.sum(axis=(0, 2), dtype=np.float64)
    b = np.asarray(bm, dtype=np.float64).reshape(c)
    iv = np.asarray(inv, dtype=np.float64).reshape(c)
    sum_gx = iv * (np.einsum("ncs,ncs->c", g3, x3, dtype=np.float64) - b * sum_g)
    gx = None
    if need[0]:
        k = np.asarray(sc, dtype=np.float64).reshape(c) * iv / m
        shp = (1, c, 1)
        A = (k * m).astype(x.dtype).reshape(shp)
        B = (-k * iv * sum_gx).astype(x.dtype).reshape(shp)
        C = (k * (iv * b * sum_gx - sum_g)).astype(x.dtype).reshape(shp)
        gx3 = np.multiply(g3, A)
        t = np.multiply(x3, B)
        gx3 += t
        gx3 += C
        gx = gx3.reshape(x.shape)
    gs = sum_gx.astype(scale.dtype).reshape(scale.shape) if need[1] else None
    gb = sum_g.astype(bias.dtype).reshape(bias.shape) if need[2] else None
    return gx, gs, gb, None, None


@gradient("BatchNormalization")
def batch_norm_grad(ctx, grads_out, inputs, outputs, *, epsilon=1e-5, training_mode=0,
                    spatial=1, **attrs):
    x, scale, bias, mean, var = inputs[:5]
    g = grads_out[0]
    if g is None:
        return (None,) * 5
    need = ctx.needs_input_grad
    axes, bshape = _bn_axes_shape(x, scale, spatial)
    training = bool(training_mode) or attrs.get("training", False)
    sc = scale.reshape(bshape)
    if training:
        m = int(math.prod(x.shape[a] for a in axes))
        if len(outputs) >= 5:  # statistics kept by batchnorm_train
            bm, inv = outputs[3].reshape(bshape), outputs[4].reshape(bshape)
        else:
            bm = x.mean(axis=axes).reshape(bshape)
            inv = 1.0 / (x.var(axis=axes).reshape(bshape) + epsilon) ** 0.5
        if ctx.xp.__name__ == "numpy" and x.dtype.kind == "f" and len(axes) == x.ndim - 1 \
                and axes[0] == 0 and x.ndim >= 2:
            if _bn_compiled_ok(x, scale, spatial) and g.dtype == x.dtype:
                got = _bn_train_grad_compiled(x, np.ascontiguousarray(g), bm, inv, scale,
                                              bias, need)
                if got is not None:
                    return got
            if _bn_fast(x, scale, spatial) and g.dtype == x.dtype:
                return _bn_train_grad_blocked(x, np.ascontiguousarray(g), bm, inv, scale,
                                              bias, need)
            return _bn_train_grad_cpu(x, g, bm, inv, sc, scale, bias, need)
        bm, inv = bm.astype(x.dtype, copy=False), inv.astype(x.dtype, copy=False)
        xhat = (x - bm) * inv
        sum_g = g.sum(axis=axes).reshape(bshape)              # = dL/dbias
        sum_gx = (g * xhat).sum(axis=axes).reshape(bshape)    # = dL/dscale
        gx = None
        if need[0]:
            # dx = scale/std/m * (m g - sum(g) - xhat sum(g xhat))
            xhat *= sum_gx
            gx = g * m
            gx -= sum_g
            gx -= xhat
            gx *= sc * inv / m
        gs = sum_gx.reshape(scale.shape) if need[1] else None
        gb = sum_g.reshape(bias.shape) if need[2] else None
        return gx, gs, gb, None, None
    inv = 1.0 / (var.reshape(bshape) + epsilon) ** 0.5
    gx = g * (sc * inv) if need[0] else None
    gs = gb = gm = gv = None
    if need[1]:
        gs = (g * ((x - mean.reshape(bshape)) * inv)).sum(axis=axes).reshape(scale.shape)
    if need[2]:
        gb = g.sum(axis=axes).reshape(bias.shape)
    if len(need) > 3 and need[3]:
        gm = (-(g * sc * inv)).sum(axis=axes).reshape(mean.shape)
    if len(need) > 4 and need[4]:
        gv = (g * sc * (x - mean.reshape(bshape)) * (-0.5) * inv ** 3).sum(
            axis=axes).reshape(var.shape)
    return gx, gs, gb, gm, gv


def _norm_backward(g, xhat, inv, axes, n):
    """dL/dx of ``xhat = (x - mean) * inv`` (stats over ``axes``, ``n`` elements) given
    dL/dxhat ``g``."""
    s1 = g.sum(axis=axes, keepdims=True)
    s2 = (g * xhat).sum(axis=axes, keepdims=True)
    return (inv / n) * (n * g - s1 - xhat * s2)


def _layer_norm_grad_compiled(x, g, scale, bias, ax, n, epsilon, need):
    """(dx, dscale, dbias) of LayerNormalization by the compiled ``norm_train.ln_grad``
    (rows of the normalised trailing axes, split over the worker threads, each chunk with its
    own partial sums of dscale/dbias), or None when it does not apply: float32 numpy arrays,
    C-contiguous, a scale (and bias) of the normalised axes' full shape."""
    if not (type(x) is np.ndarray and type(g) is np.ndarray and x.dtype == np.float32
            and g.dtype == np.float32 and scale.dtype == np.float32 and g.shape == x.shape
            and tuple(scale.shape) == tuple(x.shape[ax:]) and n > 0 and x.size > 0
            and (bias is None or tuple(bias.shape) == tuple(scale.shape))
            and x.flags.c_contiguous):
        return None
    kern = compiled.kernel("norm_train.ln_grad")
    if kern is None:
        return None
    rows = x.size // n
    g = np.ascontiguousarray(g)
    gamma = np.ascontiguousarray(scale)
    step = max(1, -(-rows // (4 * n_workers())), (1 << 14) // n)
    jobs = [(i, r0, min(rows, r0 + step)) for i, r0 in enumerate(range(0, rows, step))]
    dg = np.zeros((len(jobs), n), dtype=np.float64)
    db = np.zeros((len(jobs), n), dtype=np.float64)
    gx = np.empty_like(x) if need[0] else np.empty(1, dtype=np.float32)
    raw, ptr = kern.raw, compiled.data_pointer
    px, pg, pgam, pdx, pdg, pdb = ptr(x), ptr(g), ptr(gamma), ptr(gx), ptr(dg), ptr(db)
    want_dx = 1 if need[0] else 0

    def work(chunk):
        for i, r0, r1 in chunk:
            raw(px, pg, pgam, pdx, pdg, pdb, rows, n, i, r0, r1, want_dx, float(epsilon))
    run_blocks(np, jobs, work, 8 * x.size)
    gs = dg.sum(axis=0).astype(np.float32).reshape(scale.shape) if need[1] else None
    gb = None
    if bias is not None and len(need) > 2 and need[2]:
        gb = db.sum(axis=0).astype(np.float32).reshape(bias.shape)
    return (gx if need[0] else None), gs, gb


@gradient("LayerNormalization")
def layer_norm_grad(ctx, grads_out, inputs, outputs, *, axis=-1, epsilon=1e-5, **attrs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    g = grads_out[0]
    need = ctx.needs_input_grad
    gx = gs = gb = None
    if g is not None:
        ax = axis % x.ndim
        axes = tuple(range(ax, x.ndim))
        n = int(math.prod(x.shape[ax:]))
        got = None
        if len(grads_out) < 2 or all(go is None for go in grads_out[1:]):
            got = _layer_norm_grad_compiled(x, g, scale, bias, ax, n, epsilon, need)
        if got is not None:
            return got
        mean = x.mean(axis=axes, keepdims=True)
        xc = x - mean
        inv = 1.0 / ((xc * xc).mean(axis=axes, keepdims=True) + epsilon) ** 0.5
        xhat = xc * inv
        if need[0]:
            gx = _norm_backward(g * scale, xhat, inv, axes, n)
        if need[1]:
            gs = unbroadcast(g * xhat, scale.shape)
        if bias is not None and len(need) > 2 and need[2]:
            gb = unbroadcast(g, bias.shape)
    # gradients arriving at the optional Mean / InvStdDev outputs are not supported
    if len(grads_out) > 1 and any(go is not None for go in grads_out[1:]):
        from workbench.errors import GradientError
        raise GradientError("LayerNormalization: gradients through the Mean/InvStdDev outputs "
                            "are not supported")
    return gx, gs, gb


@gradient("InstanceNormalization")
def instance_norm_grad(ctx, grads_out, inputs, outputs, *, epsilon=1e-5, **attrs):
    x, scale, bias = inputs
    g = grads_out[0]
    need = ctx.needs_input_grad
    axes = tuple(range(2, x.ndim))
    n = int(math.prod(x.shape[2:]))
    bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    inv = 1.0 / ((xc * xc).mean(axis=axes, keepdims=True) + epsilon) ** 0.5
    xhat = xc * inv
    gx = _norm_backward(g * scale.reshape(bshape), xhat, inv, axes, n) if need[0] else None
    gs = (g * xhat).sum(axis=(0,) + axes) if need[1] else None
    gb = g.sum(axis=(0,) + axes) if need[2] else None
    return gx, gs, gb


@gradient("GroupNormalization")
def group_norm_grad(ctx, grads_out, inputs, outputs, *, epsilon=1e-5, num_groups=1, **attrs):
    x, scale, bias = inputs
    g = grads_out[0]
    need = ctx.needs_input_grad
    nb, c = x.shape[:2]
    rest = x.shape[2:]
    xg = x.reshape((nb, num_groups, -1))
    axes = (2,)
    n = xg.shape[2]
    mean = xg.mean(axis=2, keepdims=True)
    xc = xg - mean
    inv = 1.0 / ((xc * xc).mean(axis=2, keepdims=True) + epsilon) ** 0.5
    xhat = (xc * inv).reshape(x.shape)
    if scale.shape[0] == c:  # opset 21: per-channel scale/bias
        bshape = (1, c) + (1,) * len(rest)
        sc = scale.reshape(bshape)
        red = (0,) + tuple(range(2, x.ndim))
        gs = (g * xhat).sum(axis=red) if need[1] else None
        gb = g.sum(axis=red) if need[2] else None
    else:  # opset 18: per-group scale/bias
        cpg = c // num_groups
        sc = xp_of(scale).repeat(scale, cpg).reshape((1, c) + (1,) * len(rest))
        gs = (g * xhat).reshape(nb, num_groups, -1).sum(axis=(0, 2)) if need[1] else None
        gb = g.reshape(nb, num_groups, -1).sum(axis=(0, 2)) if need[2] else None
    gx = None
    if need[0]:
        gxhat = (g * sc).reshape((nb, num_groups, -1))
        gx = _norm_backward(gxhat, xhat.reshape((nb, num_groups, -1)), inv, axes, n).reshape(
            x.shape)
    return gx, gs, gb


def _channel_window_sum(xp, a, before: int, after: int):
    """out[:, c] = sum of a[:, i] for i in [c - before, c + after] (clipped to the channels)."""
    c = a.shape[1]
    cs = xp.cumsum(a, axis=1)
    zero = xp.zeros_like(cs[:, :1])
    cs = xp.concatenate([zero, cs], axis=1)               # cs[:, j] = sum of a[:, :j]
    hi = xp.minimum(xp.arange(c) + after + 1, c)
    lo = xp.maximum(xp.arange(c) - before, 0)
    return xp.take(cs, hi, axis=1) - xp.take(cs, lo, axis=1)


@gradient("LRN")
def lrn_grad(ctx, grads_out, inputs, outputs, *, size, alpha=0.0001, beta=0.75, bias=1.0,
             **attrs):
    """y_c = x_c * s_c^-beta with s_c = bias + alpha/size * (sum of x_i^2 over the channel
    window of c)."""
    xp = ctx.xp
    x = inputs[0]
    g = grads_out[0]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    s = bias + (alpha / size) * _channel_window_sum(xp, x * x, lo, hi)
    sb = s ** (-beta)
    t = g * x * sb / s                                    # g_c x_c s_c^(-beta-1)
    # channel k is in the window of c for c in [k - hi, k + lo]
    back = _channel_window_sum(xp, t, hi, lo)
    return ((g * sb - (2.0 * alpha * beta / size) * x * back).astype(x.dtype),)
