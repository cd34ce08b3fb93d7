"""Gradients of Conv and ConvTranspose (N-d, groups, strides, dilations, pads, auto_pad).

Weight gradient: im2col windows of the padded input (an ``as_strided`` view, one copy into a
matrix) times the output gradient, one GEMM per group (batched). Input gradient: the weight
matrix times the output gradient, scattered back (col2im) with one strided add per kernel
position. Depthwise convolutions (one input channel per group) use per-kernel-position
element-wise products instead of many tiny GEMMs.

ConvTranspose is the adjoint of Conv in its input: its input gradient is a plain Conv of the
output gradient (the registered Conv kernel), and its weight gradient is Conv's weight gradient
with the roles of input and output swapped.
"""

from __future__ import annotations

import itertools
import math

from workbench.arrays.geometry import window_geometry
from workbench.grad import gradient


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
    n, c = x.shape[:2]
    m = gy.shape[1]
    out_sp = gy.shape[2:]
    nsp = len(out_sp)
    cg, mg = c // group, m // group
    if cg == 1 and mg == 1 and xp.__name__ == "numpy" and int(math.prod(k)) > 1:
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


@gradient("Conv")
def conv_grad(ctx, grads_out, inputs, outputs, *, group=1, **attrs):
    xp = ctx.xp
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    g = grads_out[0]
    k, s, d, pb, pe = _geometry(x, w, outputs[0], attrs)
    need = ctx.needs_input_grad
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
