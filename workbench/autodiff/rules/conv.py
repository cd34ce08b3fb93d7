"""Gradients of Conv and ConvTranspose (N-d, groups, strides, dilations, pads, auto_pad).

Weight gradient: im2col windows of the padded input (an ``as_strided`` view, one copy into a
matrix) times the output gradient, one GEMM per group (batched). Input gradient: the weight
matrix times the output gradient, scattered back (col2im) with one strided add per kernel
position. Depthwise convolutions (one input channel per group) use per-kernel-position
element-wise products instead of many tiny GEMMs.

ConvTranspose is the adjoint of Conv in its input: its input gradient is a plain Conv of the
output gradient (the registered Conv kernel), and its weight gradient is Conv's weight gradient
with the roles of input and output swapped.

CPU fast path (numpy, float32/float64, ``group == 1``): the batch is merged into the GEMMs. The
output gradient is copied once into ``(M, N*P)`` (P output positions per image); the weight
gradient is one ``(M, N*P) @ (N*P, C*K)`` product against the im2col matrix ``(C*K, N*P)`` of
the whole batch; the input gradient is computed per block of input channels, each block one
``(cb*K, M) @ (M, N*P)`` product whose columns are added straight into the unpadded input
gradient, tap by tap (col2im, clipped to the input: no padded buffer, no crop copy). Copies,
products and col2im blocks are spread over the worker threads of ``ops.parallel``, each calling
BLAS single-threaded (BLAS' own threads busy-wait and collapse on a loaded machine). The plain
path (``_weight_grad_plain`` / ``_input_grad_plain``) handles the rest and is the reference the
tests compare the fast path with.

Compiled C paths (2-D float32 group-1 KxK convolutions of >= 8 input channels and >= 1024
output pixels over the batch, when the kernels are loaded; measured per layer, see
:func:`_iconv_applies` and ``benchmarks/bench_conv_train.py``): Conv's training form
(:func:`conv_train`) and the stride-1 input gradient run on ``gemm_avx2.iconv``, the weight
gradient on ``wgrad_avx2.wgrad`` (:func:`_weight_grad_c`), NCHW in and out through NHWC copies.
The training-bit contract: these sum the same products in another order than im2col + OpenBLAS,
so a training step's convolutions may differ from the numpy path's (and from an inference run's)
in the last bits (relative ~1e-6; the tests compare them to tolerance); every output element is
one sum in a fixed order, so no bit depends on the thread count or the split over the pool; with
the kernels off or unavailable the numpy path runs, unchanged.

Depthwise 2-D float32 on numpy: the compiled kernels ``conv_grad.dw_dx_*`` /
``conv_grad.dw_dw_*`` when they are loaded (channels split over the worker threads), else the
numpy depthwise paths of ``ops.conv`` (the reference).
"""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np  # dtype constants only

from workbench import compiled
from workbench.arrays.geometry import window_geometry
from workbench.autodiff.rules import gradient
from workbench.ops.parallel import (
    blas_controller,
    exact_products,
    fixed_matmul,
    n_workers,
    parallel_copy,
    run_blocks,
    scratch,
    single_threaded_blas,
)
from workbench.ops.registry import kernel


def _as_strided(xp, a, shape, strides):
    if xp.__name__ == "numpy":
        return xp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


def conv_pads(in_sp, k, s, d, auto_pad, pads):
    """(pads_begin, pads_end) of a Conv or pool from its attributes (``arrays.geometry``)."""
    pb, pe, _, _ = window_geometry("Conv", in_sp, k, s, d, pads, auto_pad)
    return pb, pe


def _geometry(x, w, y, attrs):
    nsp = x.ndim - 2
    k = list(attrs.get("kernel_shape") or w.shape[2:])
    s = list(attrs.get("strides") or [1] * nsp)
    d = list(attrs.get("dilations") or [1] * nsp)
    pb, pe = conv_pads(x.shape[2:], k, s, d, attrs.get("auto_pad", "NOTSET"),
                       attrs.get("pads"))
    return k, s, d, pb, pe


def _padded(xp, x, pb, pe, out_sp, k, s, d):
    """x zero-padded so that every window of the output fits."""
    sp = x.shape[2:]
    ends = []
    for i in range(len(sp)):
        need = (out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1
        ends.append(max(pe[i], need - sp[i] - pb[i]))
    if not any(pb) and not any(ends):
        return xp.ascontiguousarray(x)
    widths = [(0, 0), (0, 0)] + [(pb[i], ends[i]) for i in range(len(sp))]
    return xp.pad(x, widths)


def _windows(xp, xpad, out_sp, k, s, d):
    """View (N, C, *out, *k) of the windows of a contiguous padded input."""
    st = xpad.strides
    nsp = len(out_sp)
    shape = tuple(xpad.shape[:2]) + tuple(out_sp) + tuple(k)
    strides = st[:2] + tuple(st[2 + i] * s[i] for i in range(nsp)) + tuple(
        st[2 + i] * d[i] for i in range(nsp))
    return _as_strided(xp, xpad, shape, strides)


def _ksl(kk, d, s, out_sp):
    return tuple(slice(kk[i] * d[i], kk[i] * d[i] + (out_sp[i] - 1) * s[i] + 1, s[i])
                 for i in range(len(kk)))


def conv_weight_grad(xp, x, gy, w_shape, group, k, s, d, pb, pe):
    """dL/dW of ``y = conv(x, W)`` given dL/dy."""
    if _fast_cpu(xp, group, x, gy):
        return _grads_cpu(x, gy, None, w_shape, x.shape, k, s, d, pb, pe, False, True)[1]
    return _weight_grad_plain(xp, x, gy, w_shape, group, k, s, d, pb, pe)


def _weight_grad_plain(xp, x, gy, w_shape, group, k, s, d, pb, pe):
    n, c = x.shape[:2]
    m = gy.shape[1]
    out_sp = gy.shape[2:]
    nsp = len(out_sp)
    cg, mg = c // group, m // group
    if cg == 1 and mg == 1 and xp.__name__ == "numpy" and int(math.prod(k)) > 1:
        got = _depthwise_compiled("dw_dw", x, gy, tuple(x.shape), k, s, d, pb)
        if got is not None:
            return got.reshape(tuple(w_shape))
        # depthwise on the CPU: cache-blocked batched products, threaded (ops.conv)
        from workbench.ops.conv import depthwise_weight_grad  # noqa: PLC0415
        return depthwise_weight_grad(x, gy, list(k), list(s), list(d), list(pb),
                                     list(pe)).reshape(tuple(w_shape))
    xpad = _padded(xp, x, pb, pe, out_sp, k, s, d)
    if cg == 1:  # depthwise: one element-wise product per kernel position
        gyr = gy.reshape((n, group, mg) + tuple(out_sp))
        dw = xp.empty((group, mg, int(math.prod(k))), dtype=gy.dtype)
        axes = (0,) + tuple(range(3, 3 + nsp))
        for j, kk in enumerate(itertools.product(*[range(v) for v in k])):
            xs = xpad[(slice(None), slice(None)) + _ksl(kk, d, s, out_sp)]
            dw[:, :, j] = (gyr * xs[:, :, None]).sum(axis=axes)
        return dw.reshape(tuple(w_shape))
    p = int(math.prod(out_sp))
    kp = int(math.prod(k))
    win = _windows(xp, xpad, out_sp, k, s, d)                    # (n, c, *o, *k)
    perm = (0, 1) + tuple(range(2 + nsp, 2 + 2 * nsp)) + tuple(range(2, 2 + nsp))
    cols = win.transpose(perm).reshape(n, group, cg * kp, p)      # copy, inner runs along o
    gyr = gy.reshape(n, group, mg, p)
    if group == 1:
        dw = gyr[:, 0] @ cols[:, 0].transpose(0, 2, 1)            # (n, m, c*kp)
    else:
        dw = gyr @ cols.transpose(0, 1, 3, 2)                     # (n, g, mg, cg*kp)
    return dw.sum(axis=0).reshape(tuple(w_shape))


def conv_input_grad(xp, gy, w, x_shape, group, k, s, d, pb, pe):
    """dL/dx of ``y = conv(x, W)`` given dL/dy."""
    if _fast_cpu(xp, group, w, gy):
        return _grads_cpu(None, gy, w, w.shape, x_shape, k, s, d, pb, pe, True, False)[0]
    return _input_grad_plain(xp, gy, w, x_shape, group, k, s, d, pb, pe)


def _input_grad_plain(xp, gy, w, x_shape, group, k, s, d, pb, pe):
    n, c = x_shape[:2]
    sp = x_shape[2:]
    m = gy.shape[1]
    out_sp = gy.shape[2:]
    nsp = len(out_sp)
    cg, mg = c // group, m // group
    kp = int(math.prod(k))
    if cg > 1 and kp == 1 and tuple(out_sp) == tuple(sp) and not any(pb) and not any(pe) \
            and all(v == 1 for v in s):  # 1x1, stride 1: a plain GEMM, no scatter
        wt = w.reshape(group, mg, cg).transpose(0, 2, 1)
        return (wt @ gy.reshape(n, group, mg, -1)).reshape(tuple(x_shape))
    if cg == 1 and mg == 1 and xp.__name__ == "numpy" and kp > 1:
        got = _depthwise_compiled("dw_dx", w, gy, tuple(x_shape), k, s, d, pb)
        if got is not None:
            return got
        # depthwise on the CPU: a depthwise correlation of the spread output gradient with
        # the flipped kernel, on the forward's blocked, threaded kernel (ops.conv)
        from workbench.ops.conv import depthwise_input_grad  # noqa: PLC0415
        return depthwise_input_grad(gy, w, x_shape, list(k), list(s), list(d), list(pb))
    pad_sp = []
    for i in range(nsp):
        need = (out_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1
        pad_sp.append(max(sp[i] + pb[i] + pe[i], need))
    dxpad = xp.zeros((n, c) + tuple(pad_sp), dtype=gy.dtype)
    kidx = list(itertools.product(*[range(v) for v in k]))
    if cg == 1:  # depthwise
        gyr = gy.reshape((n, group, mg) + tuple(out_sp))
        wr = w.reshape(group, mg, kp)
        bshape = (1, group, mg) + (1,) * nsp
        tmp = xp.empty((n, group) + tuple(out_sp), dtype=gy.dtype) if mg == 1 else None
        for j, kk in enumerate(kidx):
            if mg > 1:
                contrib = (gyr * wr[:, :, j].reshape(bshape)).sum(axis=2)
            else:
                contrib = xp.multiply(gyr[:, :, 0], wr[:, 0, j].reshape(
                    (1, group) + (1,) * nsp), out=tmp)
            dxpad[(slice(None), slice(None)) + _ksl(kk, d, s, out_sp)] += contrib
    else:
        p = int(math.prod(out_sp))
        wt = w.reshape(group, mg, cg * kp).transpose(0, 2, 1)        # (g, cg*kp, mg)
        dcols = wt @ gy.reshape(n, group, mg, p)                      # (n, g, cg*kp, p)
        dcols = dcols.reshape((n, c, kp) + tuple(out_sp))
        for j, kk in enumerate(kidx):
            dxpad[(slice(None), slice(None)) + _ksl(kk, d, s, out_sp)] += dcols[:, :, j]
    crop = (slice(None), slice(None)) + tuple(slice(pb[i], pb[i] + sp[i]) for i in range(nsp))
    return dxpad[crop]


# --------------------------------------------------------------------------- CPU fast path
_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_DCOLS_BLOCK = 1 << 22  # elements of one input-gradient column block (cb*K x N*P)


def _depthwise_compiled(which, a, gy, x_shape, k, s, d, pb):
    """dL/dX (``which`` "dw_dx", ``a`` the weights) or dL/dW ("dw_dw", ``a`` the input, the
    result (C, KH, KW)) of a 2-D depthwise convolution by the compiled kernels, or None when
    they do not apply (not float32 2-D, a horizontal stride other than 1 or 2, not loaded:
    the caller's numpy path runs)."""
    if len(k) != 2 or a.dtype != np.float32 or gy.dtype != np.float32 or int(s[1]) not in (1, 2):
        return None
    kern = compiled.kernel(f"conv_grad.{which}_s{int(s[1])}")
    if kern is None:
        return None
    n, c, h, w_ = (int(v) for v in x_shape)
    oh, ow = (int(v) for v in gy.shape[2:])
    kh, kw = (int(v) for v in k)
    a = np.ascontiguousarray(a)
    gy = np.ascontiguousarray(gy)
    if which == "dw_dx":
        a = a.reshape(c, kh, kw)
        out = np.empty(x_shape, dtype=np.float32)
    else:
        out = np.empty((c, kh, kw), dtype=np.float32)
    if out.size == 0:
        return out
    geo = (n, c, h, w_, oh, ow, kh, kw, int(s[0]), int(s[1]), int(d[0]), int(d[1]),
           int(pb[0]), int(pb[1]))
    step = max(1, -(-c // (4 * n_workers())))

    if which == "dw_dx":
        def work(chunk):
            for c0, c1 in chunk:
                kern(gy, a, out, *geo, c0, c1)
    else:
        def work(chunk):
            acc = np.empty(max(1, ow), dtype=np.float32)   # this thread's lanes
            for c0, c1 in chunk:
                kern(a, gy, out, acc, *geo, c0, c1)
    run_blocks(np, [(i, min(c, i + step)) for i in range(0, c, step)], work,
               n * c * oh * ow * kh * kw)
    return out


def _fast_cpu(xp, group, *arrays) -> bool:
    """Whether the batched-GEMM CPU path applies: numpy arrays of one float32/float64 dtype,
    an ungrouped convolution (depthwise and grouped ones have their own paths)."""
    if group != 1 or xp.__name__ != "numpy":
        return False
    dt = arrays[0].dtype
    return dt in _FAST_DTYPES and all(a.dtype == dt for a in arrays)


def _tap_ranges(kk, s, d, pb, sp, out_sp):
    """For kernel tap ``kk``: (output slices, input slices) of the output positions whose
    input position lies inside the unpadded input (None when there are none)."""
    osl, isl = [], []
    for i in range(len(sp)):
        off = kk[i] * d[i] - pb[i]               # input index of output 0 for this tap
        o0 = (-off + s[i] - 1) // s[i] if off < 0 else 0       # first o with o*s + off >= 0
        last = sp[i] - 1 - off                                  # o*s <= last
        o1 = min(out_sp[i], last // s[i] + 1) if last >= 0 else 0
        if o1 <= o0:
            return None
        osl.append(slice(o0, o1))
        start = o0 * s[i] + off
        isl.append(slice(start, start + (o1 - o0 - 1) * s[i] + 1, s[i]))
    return tuple(osl), tuple(isl)


def _flip_transpose(w, nsp):
    """(M, C, *k) -> (C, M, *k) with every spatial axis reversed, contiguous."""
    flip = (slice(None), slice(None)) + (slice(None, None, -1),) * nsp
    return w[flip].swapaxes(0, 1).copy()


def _forward_conv():
    from workbench.ops.registry import lookup  # noqa: PLC0415 - resolved once per call
    return lookup("Conv", "", 11).fn


def _grads_cpu(x, gy, w, w_shape, x_shape, k, s, d, pb, pe, need_x, need_w):
    """(dL/dx, dL/dW) of an ungrouped convolution on numpy (see the module docstring)."""
    n, c = x_shape[:2]
    sp = tuple(x_shape[2:])
    m = gy.shape[1]
    out_sp = tuple(gy.shape[2:])
    nsp = len(out_sp)
    kp = int(math.prod(k))
    p = int(math.prod(out_sp))
    dt = gy.dtype
    nw = n_workers()
    ctl = blas_controller() if nw > 1 else None
    pointwise = kp == 1 and not any(pb) and all(v == 1 for v in s) and out_sp == sp
    merged = []

    def gy_merged():
        """The output gradient as (M, N*P), copied once, shared by both products."""
        if not merged:
            gym = np.empty((m, n) + out_sp, dtype=dt)
            parallel_copy(np, gym, gy.transpose((1, 0) + tuple(range(2, 2 + nsp))), axis=0)
            merged.append(gym.reshape(m, n * p))
        return merged[0]

    gx = gw = None
    kept = []   # the weight gradient's channels-last copy of dL/dy, read again by dL/dx
    if need_w and pointwise and m * c <= p * (m + c):
        # 1x1, stride 1, per-image partial products smaller than the transposed copies:
        # (N, M, P) @ (N, P, C) on the arrays as they are, summed over the images
        with single_threaded_blas(ctl):
            parts = fixed_matmul(np, gy.reshape(n, m, p),
                                    x.reshape(n, c, p).transpose(0, 2, 1))
        gw = parts.sum(axis=0).reshape(tuple(w_shape))
    elif need_w and (gw := _weight_grad_c(x, gy, w_shape, k, s, d, pb, kept)) is not None:
        pass
    elif need_w:
        if pointwise:
            src = x.transpose((1, 0) + tuple(range(2, 2 + nsp)))        # (C, N, *sp)
            cols = scratch(np, (c, n) + out_sp, dt)
        else:
            xpad = _padded(np, x, pb, pe, out_sp, k, s, d)
            win = _windows(np, xpad, out_sp, k, s, d)                   # (N, C, *o, *k)
            src = win.transpose((1,) + tuple(range(2 + nsp, 2 + 2 * nsp)) + (0,)
                                + tuple(range(2, 2 + nsp)))             # (C, *k, N, *o)
            cols = scratch(np, (c,) + tuple(k) + (n,) + out_sp, dt)
        parallel_copy(np, cols, src, axis=0)
        cols = cols.reshape(c * kp, n * p)
        gw = fixed_matmul(np, gy_merged(), cols.T).reshape(tuple(w_shape))
    if need_x:
        w2 = w.reshape(m, c * kp)
        if pointwise:
            # 1x1, stride 1: one product per image straight into dx, no scatter
            gx = np.empty(tuple(x_shape), dtype=dt)
            fixed_matmul(np, w2.T, gy.reshape(n, m, p), out=gx.reshape(n, c, p))
            return gx, gw
        ext = [(k[i] - 1) * d[i] for i in range(nsp)]
        if kp > 1 and all(v == 1 for v in s) and all(pb[i] <= ext[i] and pe[i] <= ext[i]
                                                       for i in range(nsp)):
            # stride 1: dx is the correlation of dy with the flipped, transposed kernel, run
            # on the forward Conv kernel (its im2col + threaded GEMM beat a col2im scatter)
            pads = [ext[i] - pb[i] for i in range(nsp)] + [ext[i] - pe[i] for i in range(nsp)]
            gx = _input_grad_iconv(gy, w, x_shape, d, pads, kept[0] if kept else None)
            if gx is not None:
                return gx, gw
            wf = _flip_transpose(w, nsp)
            gx = _forward_conv()(gy, wf, None, dilations=list(d), pads=pads)
            if tuple(gx.shape) == tuple(x_shape):
                return gx, gw
        gx = np.empty(tuple(x_shape), dtype=dt)
        taps = [(kk, _tap_ranges(kk, s, d, pb, sp, out_sp))
                for kk in itertools.product(*[range(v) for v in k])]
        # blocks of input channels fixed by the shape (rows of one product each: where a
        # block starts decides how BLAS rounds its rows, so never by the thread count)
        cb = max(1, min(-(-c // 4), _DCOLS_BLOCK // max(1, kp * n * p)))
        jobs = [(c0, min(c, c0 + cb)) for c0 in range(0, c, cb)]
        gym = gy_merged()

        def work(chunk):
            for c0, c1 in chunk:
                dcols = scratch(np, ((c1 - c0) * kp, n * p), dt, slot="grad_dcols")
                np.matmul(w2[:, c0 * kp:c1 * kp].T, gym, out=dcols)
                dcols = dcols.reshape((c1 - c0, kp, n) + out_sp)
                dxb = gx[:, c0:c1]
                dxb.fill(0)
                for j, (_, rng) in enumerate(taps):
                    if rng is None:
                        continue
                    osl, isl = rng
                    src = dcols[(slice(None), j, slice(None)) + osl]    # (cb, N, *o)
                    tgt = dxb[(slice(None), slice(None)) + isl]
                    np.add(tgt, src.transpose((1, 0) + tuple(range(2, 2 + nsp))), out=tgt)
        with single_threaded_blas(ctl):
            run_blocks(np, jobs, work, 1 << 30)
    return gx, gw


@gradient("Conv")
def conv_grad(ctx, grads_out, inputs, outputs, *, group=1, **attrs):
    # the products inside (and the forward Conv kernel the input gradient may run on) give
    # the same bits at any thread count (ops.parallel.exact_products / fixed_matmul)
    with exact_products():
        return _conv_grad(ctx, grads_out, inputs, outputs, group, attrs)


def _conv_grad(ctx, grads_out, inputs, outputs, group, attrs):
    xp = ctx.xp
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    g = grads_out[0]
    k, s, d, pb, pe = _geometry(x, w, outputs[0], attrs)
    need = ctx.needs_input_grad
    if (need[0] or need[1]) and _fast_cpu(xp, group, x, w, g):
        gx, gw = _grads_cpu(x, g, w, w.shape, x.shape, k, s, d, pb, pe, need[0], need[1])
        return gx, gw, conv_bias_grad(g, b, need)
    gx = conv_input_grad(xp, g, w, x.shape, group, k, s, d, pb, pe) if need[0] else None
    gw = conv_weight_grad(xp, x, g, w.shape, group, k, s, d, pb, pe) if need[1] else None
    return gx, gw, conv_bias_grad(g, b, need)


def conv_bias_grad(g, b, need):
    """dL/dB of a convolution: the output gradient summed over all but the channel axis."""
    if b is not None and len(need) > 2 and need[2]:
        return g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return None


def conv_transpose_pads(x, w, y, attrs):
    nsp = x.ndim - 2
    k = list(attrs.get("kernel_shape") or w.shape[2:])
    s = list(attrs.get("strides") or [1] * nsp)
    d = list(attrs.get("dilations") or [1] * nsp)
    op = list(attrs.get("output_padding") or [0] * nsp)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    pads = attrs.get("pads")
    if attrs.get("output_shape") or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe = [], []
        for i in range(nsp):
            total = s[i] * (x.shape[2 + i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - y.shape[2 + i]
            if auto_pad == "SAME_UPPER":
                pb.append(total // 2), pe.append(total - total // 2)
            else:
                pb.append(total - total // 2), pe.append(total // 2)
    elif auto_pad == "VALID" or not pads:
        pb, pe = [0] * nsp, [0] * nsp
    else:
        pb, pe = list(pads[:nsp]), list(pads[nsp:])
    return k, s, d, pb, pe


@gradient("ConvTranspose")
def conv_transpose_grad(ctx, grads_out, inputs, outputs, *, group=1, **attrs):
    with exact_products():   # the same bits at any thread count, as conv_grad
        return _conv_transpose_grad(ctx, grads_out, inputs, outputs, group, attrs)


def _conv_transpose_grad(ctx, grads_out, inputs, outputs, group, attrs):
    from workbench.ops.registry import lookup
    xp = ctx.xp
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    g = grads_out[0]
    k, s, d, pb, pe = conv_transpose_pads(x, w, outputs[0], attrs)
    need = ctx.needs_input_grad
    gx = gw = gb = None
    if need[0]:
        conv = lookup("Conv", "", 11).fn
        gx = conv(g, w, None, auto_pad="NOTSET", dilations=d, group=group, kernel_shape=k,
                  pads=pb + pe, strides=s)
        gx = gx[tuple(slice(0, v) for v in x.shape)]
    if need[1]:
        # conv weight gradient with input = g (N, M, out) and output-gradient = x (N, C, in)
        gw = conv_weight_grad(xp, g, x, w.shape, group, k, s, d, pb, pe)
    if b is not None and len(need) > 2 and need[2]:
        gb = g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return gx, gw, gb


# ------------------------------------------------------- the training step's KxK convolutions
# Conv's training form and the stride-1 input gradient run on the compiled channels-last
# indirect GEMM (``gemm_avx2.iconv``, see ops.conv_nhwc) when it is loaded: NCHW in and out,
# the input (or output gradient) transposed to NHWC once and the result back.
_ICONV_MIN_ROWS = 1024   # output pixels (all images) from which iconv is taken
_ICONV_MIN_C = 8         # input channels from which iconv is taken
_WGRAD_MIN_ROWS = 1024   # output pixels (all images) from which wgrad_avx2 is taken:
# measured as _ICONV_MIN_ROWS (dW of ResNet-18's 56x56 and 28x28 layers 1.1-1.3x faster than
# the im2col copy + OpenBLAS, 14x14 even, 7x7, the 3-channel stem and the strided 1x1
# downsamples slower: those keep the im2col path)


def _iconv_applies(x, w, group, rows):
    """Whether ``gemm_avx2.iconv`` takes this convolution (its kernel, else None): numpy
    float32 2-D, group 1, a kernel of more than one tap, at least :data:`_ICONV_MIN_C` input
    channels and :data:`_ICONV_MIN_ROWS` output pixels over the batch. Measured per layer
    (ResNet-18 at batch 8, one thread, CPU time, AMD EPYC AVX2, medians of 11 alternated
    calls): the forward and the input gradient of the 3x3 layers of 56x56, 28x28 and 14x14
    output pixels 1.05-1.3x faster than im2col + OpenBLAS; at 7x7 (392 pixels for 4.7-9.4 MB
    of weights, packed anew each step since training changes them) and the 3-channel 7x7
    stem 1.1-1.2x slower."""
    if group != 1 or not isinstance(x, np.ndarray) or not isinstance(w, np.ndarray) \
            or x.dtype != np.float32 or w.dtype != np.float32 or x.ndim != 4 or w.ndim != 4 \
            or int(w.shape[2]) * int(w.shape[3]) < 2 or int(x.shape[1]) < _ICONV_MIN_C \
            or rows < _ICONV_MIN_ROWS:
        return None
    return compiled.kernel("gemm_avx2.iconv")


def _iconv_nchw(x, w_hwio, b, s, d, pb, out, xn=None):
    """``conv(x, W) + b`` by ``gemm_avx2.iconv``: x (N, C, H, W) float32, ``w_hwio`` the
    weights as a (KH, KW, C, M) view (any strides: they are packed), b (M,) or None; the
    result (N, M, OH, OW) float32, C-contiguous. Every output element is one accumulation
    over (tap, channel) in a fixed order whatever the thread count (the pool splits output
    pixels). ``xn``: x's channels-last copy when the caller has one (the weight gradient's
    copy of dL/dy), else it is made here."""
    from workbench.ops.conv_nhwc import _Epilogue, _indirect  # noqa: PLC0415

    n, m = int(x.shape[0]), int(w_hwio.shape[3])
    oh, ow = (int(v) for v in out)
    shape = (n,) + tuple(x.shape[2:]) + (int(x.shape[1]),)
    if xn is None or tuple(xn.shape) != shape or xn.dtype != np.float32 \
            or not xn.flags.c_contiguous:
        xn = scratch(np, shape, np.float32, slot="iconv_x")
        parallel_copy(np, xn, x.transpose(0, 2, 3, 1), axis=0)
    yn = scratch(np, (n, oh, ow, m), np.float32, slot="iconv_y")
    b = None if b is None else np.ascontiguousarray(b, np.float32).reshape(m)
    epi = _Epilogue(b, None, "", 0.0, 0.0, m)
    if not _indirect(xn, w_hwio, epi, tuple(s), tuple(d), tuple(pb), (oh, ow), yn):
        return None
    y = np.empty((n, m, oh, ow), np.float32)
    parallel_copy(np, y, yn.transpose(0, 3, 1, 2), axis=0)
    return y


def _input_grad_iconv(gy, w, x_shape, d, pads, gy_nhwc=None):
    """dL/dx of a stride-1 2-D convolution by ``iconv``: the correlation of dL/dy, padded by
    ``pads`` (the kernel's extent minus the forward's pads), with the kernel flipped in space
    and its channel axes swapped — read as the (KH, KW, M, C) view ``w[:, :, ::-1,
    ::-1].transpose(2, 3, 0, 1)``, packed without a copy of its own. ``gy_nhwc``: dL/dy's
    channels-last copy when the weight gradient made one (the same values: not copied
    again). None when it does not apply (the caller's im2col path runs)."""
    rows = int(math.prod(x_shape)) // max(1, int(x_shape[1]))
    if len(x_shape) != 4 or gy.size == 0 or _iconv_applies(gy, w, 1, rows) is None:
        return None
    wf = w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)
    gx = _iconv_nchw(gy, wf, None, (1, 1), d, pads[:2], tuple(x_shape[2:]), gy_nhwc)
    if gx is None or tuple(gx.shape) != tuple(x_shape):
        return None
    return gx


@kernel("Conv", since=1, train=True, same_results=True)
def conv_train(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None):
    """Conv's training form: the same convolution; float32 2-D group-1 KxK convolutions on
    numpy run on ``gemm_avx2.iconv`` (NCHW in and out, through a channels-last copy) when it
    is loaded, the rest on the registered Conv kernel. A training step's convolutions may
    differ from an inference run's in the last bits (another order of the same sums). Its
    products (im2col GEMMs) give the same bits at any thread count (``exact_products``:
    ``ops.parallel.fixed_matmul``)."""
    with exact_products():   # im2col products with the same bits at any thread count
        return _conv_train(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides)


def _conv_train(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides):
    from workbench.arrays import xp_of  # noqa: PLC0415
    from workbench.arrays.geometry import window_geometry as geom  # noqa: PLC0415
    from workbench.ops.conv import _check_conv_inputs, _kernel_from  # noqa: PLC0415
    from workbench.ops.registry import lookup  # noqa: PLC0415
    from workbench.ops.windows import spatial_ints  # noqa: PLC0415

    if _iconv_applies(X, W, int(group), _ICONV_MIN_ROWS) is not None \
            and (B is None or B.dtype == np.float32):
        _check_conv_inputs("Conv", X, W, B, int(group))
        ks = _kernel_from("Conv", W, kernel_shape)
        st = spatial_ints("Conv", "strides", strides, 2, 1)
        dl = spatial_ints("Conv", "dilations", dilations, 2, 1)
        pb, _pe, out, _extra = geom("Conv", X.shape[2:], ks, st, dl, pads, auto_pad)
        if int(X.shape[0]) * int(math.prod(out)) >= _ICONV_MIN_ROWS:
            y = _iconv_nchw(X, W.transpose(2, 3, 1, 0), B, st, dl, pb, out)
            if y is not None:
                return y
    return lookup("Conv", "", None, xp=xp_of(X, W)).fn(
        X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
        kernel_shape=kernel_shape, pads=pads, strides=strides)


_WGRAD_TABLES: dict = {}   # shapes -> the indirection table of the weight gradient
_WGRAD_LOCK = threading.Lock()


def _weight_grad_c(x, gy, w_shape, k, s, d, pb, keep=None):
    """dL/dW of a 2-D float32 group-1 convolution by ``wgrad_avx2.wgrad`` (no im2col: the
    NHWC copies of x and dL/dy read through the indirection table), channel (or tap) ranges
    over the worker threads; each element one sum over the pixels in order, whatever the
    split. None when it does not apply or is not loaded (the im2col path runs). ``keep``: a
    list that receives the NHWC copy of dL/dy (a scratch buffer of this thread: valid until
    its slot is asked for again), for the input gradient that follows."""
    if len(k) != 2 or x.dtype != np.float32 or gy.dtype != np.float32 or x.ndim != 4 \
            or int(k[0]) * int(k[1]) < 2 or int(x.shape[1]) < _ICONV_MIN_C \
            or int(gy.shape[0]) * int(gy.shape[2]) * int(gy.shape[3]) < _WGRAD_MIN_ROWS:
        return None
    kern = compiled.kernel("wgrad_avx2.wgrad")
    if kern is None:
        return None
    from workbench.ops.conv_nhwc import indirection  # noqa: PLC0415

    n, c, h, wd = (int(v) for v in x.shape)
    m, oh, ow = (int(v) for v in gy.shape[1:])
    kh, kw = (int(v) for v in k)
    taps = kh * kw
    key = (h, wd, c, kh, kw, tuple(s), tuple(d), tuple(pb[:2]), oh, ow)
    ind = _WGRAD_TABLES.get(key)
    if ind is None:
        ind = indirection(h, wd, c, kh, kw, tuple(s), tuple(d), tuple(pb[:2]), (oh, ow))
        ind = np.ascontiguousarray(ind, np.int64)
        with _WGRAD_LOCK:   # steps may run in several threads
            while len(_WGRAD_TABLES) >= 64:
                _WGRAD_TABLES.pop(next(iter(_WGRAD_TABLES)))
            _WGRAD_TABLES[key] = ind
    xn = scratch(np, (n, h, wd, c), np.float32, slot="wgrad_x")
    parallel_copy(np, xn, x.transpose(0, 2, 3, 1), axis=0)
    gn = scratch(np, (n, oh, ow, m), np.float32, slot="wgrad_dy")
    parallel_copy(np, gn, gy.transpose(0, 2, 3, 1), axis=0)
    if keep is not None:
        keep.append(gn)
    zero = np.zeros(c, np.float32)
    dw = np.empty((taps, m, c), np.float32)
    rows = n * oh * ow
    cp = -(-c // 16)
    bp = min(512, max(64, (65536 // (cp * 16)) // 8 * 8))   # ~256 KiB of packed X per tap
    dp = compiled.data_pointer
    args = (dp(xn), dp(ind), dp(zero), dp(gn), dp(dw))
    geo = (c, taps, m, oh * ow, h * wd * c, rows, bp)
    nw = n_workers()
    if nw == 1:
        jobs = [(0, taps, 0, m)]
    elif m >= 12 * nw:
        # one output-channel range (whole 6-row tiles) per worker: each range packs the
        # block's X again, so finer ranges cost CPU (2 threads, 3x3 layers of 64-256
        # channels: 4 ranges 32-52 ms CPU, 2 ranges 27-42)
        step = -(-m // nw // 6) * 6
        jobs = [(0, taps, m0, min(m, m0 + step)) for m0 in range(0, m, step)]
    else:
        jobs = [(t, t + 1, 0, m) for t in range(taps)]
    raw = kern.raw
    most = max(j[3] - j[2] for j in jobs)

    def work(chunk):
        yk = np.empty(-(-most // 6) * 6 * bp, np.float32)   # this thread's work buffers
        xk = np.empty(cp * 16 * bp, np.float32)
        for t0, t1, m0, m1 in chunk:
            raw(*args, dp(yk), dp(xk), *geo, t0, t1, m0, m1)
    if len(jobs) == 1:
        work(jobs)
    else:
        run_blocks(np, jobs, work, rows * m * c * taps)
    return np.ascontiguousarray(dw.transpose(1, 2, 0)).reshape(tuple(w_shape))
