"""Convolutions: Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im, CausalConvWithState.

Conv is GEMM based. The padded input is viewed as sliding windows through ``as_strided`` (no
copy); the windows are copied once into an im2col matrix and multiplied by the weights in one
``matmul`` per group set (per image, or over the whole batch for small images), split over
threads. 1x1 convolutions skip the im2col copy (a plain matmul). Depthwise convolutions (one
input channel per group) lay the input out so that every kernel tap is a contiguous slice and
run cache-sized im2col blocks through batched ``(1, K) @ (K, n)`` products. ConvTranspose is
the adjoint: one matmul, then the columns are scattered back (col2im) with one strided add per
kernel tap.

Float16/bfloat16 inputs are computed in float32 and cast back; float32 stays float32 (BLAS
sgemm accumulates in float32); float64 stays float64. The window helpers here
(:mod:`workbench.ops.windows`) and the threading/BLAS helpers (:mod:`workbench.ops.parallel`)
are shared with the pooling and linalg kernels.
"""

from __future__ import annotations

import itertools
import math

import numpy as np  # host-side checks only

from workbench import compiled
from workbench.arrays import xp_of
from workbench.arrays.geometry import norm_auto_pad, window_geometry
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops._common import compute_dtype, quiet, to_compute
from workbench.ops.parallel import (
    blas_controller,
    exact_products_active,
    fixed_matmul,
    n_workers,
    parallel_add,
    parallel_copy,
    parallel_matmul,
    run_blocks,
    scratch,
    single_threaded_blas,
)
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.windows import (
    WideTaps,
    pad_spatial,
    sliding_windows,
    spatial_ints,
    tap_view,
)

# --------------------------------------------------------------------------------------------
# the convolution core (inputs already in compute dtype)
# --------------------------------------------------------------------------------------------

_MERGE_BELOW = 256  # output positions per image under which one GEMM spans the whole batch


class Epilogue:
    """What follows the products of a convolution, applied piece by piece in the worker that
    computed the piece (in cache): ``+ bias`` (per output channel), ``+ z`` (a residual of the
    output's shape), then an activation (see :func:`apply_activation`)."""

    def __init__(self, bias=None, z=None, activation="", alpha=0.0, beta=0.0):
        self.bias, self.z = bias, z
        self.activation, self.alpha, self.beta = activation, alpha, beta

    def __call__(self, y, rows=slice(None), cols=slice(None), chans=slice(None)):
        """Apply to ``y`` = the output's images ``rows``, channels ``chans`` and flattened
        positions ``cols``, viewed as (n, m, positions)."""
        if self.bias is not None:
            y += self.bias.reshape(-1)[chans].reshape(1, -1, 1)
        if self.z is not None:
            zz = self.z.reshape(self.z.shape[0], self.z.shape[1], -1)[rows, chans, cols]
            y += zz.astype(y.dtype, copy=False)
        if self.activation:
            apply_activation(y, self.activation, self.alpha, self.beta)


def conv_core(x, w, b, group, strides, dilations, pb, pe, extra, out_shape, epi=None):
    """Y = conv(x, w) + b for arrays in compute dtype; geometry already resolved.

    ``epi`` (an :class:`Epilogue`, whose bias is then ``b``) adds the residual and applies the
    activation as well, on each piece of the output as soon as it is computed."""
    if epi is not None and not (epi.z is not None or epi.activation):
        epi = None
    xp = xp_of(x, w)
    N, C = x.shape[:2]
    M = w.shape[0]
    ksh = tuple(w.shape[2:])
    nd = len(ksh)
    K = int(math.prod(ksh))
    OUT = int(math.prod(out_shape))
    Cg, Mg = C // group, M // group
    dtype = x.dtype
    if N == 0 or M == 0 or OUT == 0:
        y = xp.zeros((N, M, *out_shape), dtype=dtype)
        return y + b.reshape((1, M) + (1,) * nd) if b is not None and y.size else y

    if group == C and group == M and w.shape[1] == 1 and K > 1:
        return _depthwise(x, w, b, strides, dilations, pb, pe, extra, out_shape, epi)

    pe_all = [e + x_ for e, x_ in zip(pe, extra)]
    if K == 1:
        xs = pad_spatial(x, pb, pe_all, 0)
        if any(s != 1 for s in strides) or list(xs.shape[2:]) != list(out_shape):
            xs = tap_view(xs, (0,) * nd, strides, dilations, out_shape)
        merged = OUT < _MERGE_BELOW and N > 1
        if merged:
            cols = scratch(xp, (group, Cg, N) + tuple(out_shape), dtype)
            xp.copyto(cols, xs.reshape((N, group, Cg) + tuple(out_shape)).transpose(
                (1, 2, 0) + tuple(range(3, 3 + nd))))
            cols = cols.reshape(group, Cg, N * OUT)
        else:
            cols = xs.reshape(N, group, Cg, OUT)  # a view when xs is contiguous
    else:
        xpad = pad_spatial(x, pb, pe_all, 0)
        win = sliding_windows(xpad, ksh, strides, dilations, out_shape)
        win = win.reshape((N, group, Cg) + ksh + tuple(out_shape))
        merged = OUT < _MERGE_BELOW and N > 1
        if merged:
            cols = scratch(xp, (group, Cg) + ksh + (N,) + tuple(out_shape), dtype)
            order = (1, 2) + tuple(range(3, 3 + nd)) + (0,) + tuple(range(3 + nd, 3 + 2 * nd))
            parallel_copy(xp, cols, win.transpose(order), axis=1)
            cols = cols.reshape(group, Cg * K, N * OUT)
        else:
            cols = scratch(xp, (N, group, Cg) + ksh + tuple(out_shape), dtype)
            parallel_copy(xp, cols, win, axis=0)
            cols = cols.reshape(N, group, Cg * K, OUT)

    wm = w.reshape(group, Mg, Cg * K)
    bias = None if b is None else b.reshape(1, M, 1)
    # a training step's products: pieces fixed by the shape, the same bits at any thread count
    mm = fixed_matmul if exact_products_active() else parallel_matmul
    if merged:
        y = mm(xp, wm, cols)  # (group, Mg, N*OUT)
        y = y.reshape(M, N, OUT).transpose(1, 0, 2)
        out = xp.empty((N, M, OUT), dtype=dtype)
        post = None
        if epi is not None:  # the bias is added by parallel_add
            rest = Epilogue(None, epi.z, epi.activation, epi.alpha, epi.beta)

            def post(piece, n0, n1):
                rest(piece, slice(n0, n1))
        parallel_add(xp, out, y, bias, post)
        return out.reshape((N, M) + tuple(out_shape))
    if epi is not None:  # bias, residual and activation on each GEMM piece, in its worker
        full_epi = Epilogue(b, epi.z, epi.activation, epi.alpha, epi.beta)

        def after(piece, rows, cols_):
            for g in range(group):   # piece is (n, group, Mg, positions): views per group
                full_epi(piece[:, g], rows, cols_, slice(g * Mg, (g + 1) * Mg))
        y = mm(xp, wm, cols, epilogue=after).reshape(N, M, OUT)
        return y.reshape((N, M) + tuple(out_shape))
    y = mm(xp, wm, cols).reshape(N, M, OUT)  # (N, group, Mg, OUT)
    if bias is not None:
        parallel_add(xp, y, y, bias)
    return y.reshape((N, M) + tuple(out_shape))


_DW_CALL = 1 << 17  # depthwise: multiply-adds per BLAS call, below OpenBLAS' threading size
_DW_BLOCK = 1 << 16  # depthwise: outputs per block (enough work per Python call to thread)


def _dw_jobs(N, C, rows, rowlen, L, K):
    """Blocks (c0, c1, n0, n1, r0, r1) of channels, images and output rows for the depthwise
    loops, sized so that one block's im2col stays in cache and each BLAS call stays small;
    returns (images per block, rows per block, channels per block, jobs)."""
    budget = max(rowlen, _DW_CALL // K)  # columns of one (1, K) @ (K, n) product
    if N * L <= budget:
        nb, rb = N, rows
    elif L <= budget:
        nb, rb = budget // L, rows
    else:
        nb, rb = 1, budget // rowlen
    G = max(1, _DW_BLOCK // (nb * rb * rowlen))  # channels per block
    jobs = [(c0, min(C, c0 + G), n0, min(N, n0 + nb), r0, min(rows, r0 + rb))
            for c0 in range(0, C, G) for n0 in range(0, N, nb) for r0 in range(0, rows, rb)]
    return nb, rb, G, jobs


def depthwise_weight_grad(x, gy, ksh, strides, dilations, pb, pe):
    """dL/dW, shape (C, 1, *k), of a depthwise convolution (group == C == M) on numpy arrays.

    The adjoint of :func:`_depthwise` in W: the same cache-sized blocks of kernel taps (a
    :class:`WideTaps` im2col block) times the matching block of the output gradient laid out
    "wide" (zeros in the junk columns), as batched ``(K, n) @ (n, 1)`` products spread over
    the threads; the per-block partial sums are added at the end."""
    N, C = (int(v) for v in x.shape[:2])
    out_shape = [int(v) for v in gy.shape[2:]]
    nd = len(ksh)
    K = int(math.prod(ksh))
    dt = x.dtype
    pe_fit = []
    for a in range(nd):  # the windows of every output must fit
        need = (out_shape[a] - 1) * strides[a] + (ksh[a] - 1) * dilations[a] + 1
        pe_fit.append(max(int(pe[a]), need - int(x.shape[2 + a]) - int(pb[a])))
    wide = WideTaps(x, pb, pe_fit, 0, ksh, strides, dilations, out_shape)
    views = wide.views()
    L, rowlen, rows = wide.L, wide.rowlen, out_shape[0]
    gw = np.zeros((N, C, L), dtype=dt)
    wide.valid(gw)[...] = gy.reshape((N, C, rows) + tuple(out_shape[1:]))
    nb, rb, G, jobs = _dw_jobs(N, C, rows, rowlen, L, K)
    partial = {}

    def work(chunk):
        seg = rb * rowlen
        cols = np.empty((G, K, nb, seg), dtype=dt)
        for job in chunk:
            c0, c1, n0, n1, r0, r1 = job
            g, m, n = c1 - c0, n1 - n0, (r1 - r0) * rowlen
            cb = cols[:g, :, :m, :n]
            lo = r0 * rowlen
            for t, v in enumerate(views):
                np.copyto(cb[:, t], v[n0:n1, c0:c1, lo:lo + n].swapaxes(0, 1))
            gb = np.ascontiguousarray(gw[n0:n1, c0:c1, lo:lo + n].swapaxes(0, 1))
            partial[job] = np.matmul(cb.reshape(g, K, m * n), gb.reshape(g, m * n, 1))
    with single_threaded_blas(blas_controller()):
        run_blocks(np, jobs, work, 2 * K * C * N * L)
    dw = np.zeros((C, K), dtype=dt)
    for (c0, c1, *_), r in partial.items():
        dw[c0:c1] += r[:, :, 0]
    return dw.reshape((C, 1) + tuple(ksh))


def depthwise_input_grad(gy, w, x_shape, ksh, strides, dilations, pb):
    """dL/dx of a depthwise convolution (group == C == M) on numpy arrays: the output gradient,
    spread on the input grid (``o * stride``) and padded by ``(k - 1) * d - pb``, correlated
    with the flipped kernel by :func:`_depthwise` (stride 1): ``dx[i] = sum_t gy[o] w[t]``
    over ``o * s - pb + t * d == i``."""
    N, C = (int(v) for v in x_shape[:2])
    X = [int(v) for v in x_shape[2:]]
    O = [int(v) for v in gy.shape[2:]]
    nd = len(X)
    size = [X[a] + (ksh[a] - 1) * dilations[a] for a in range(nd)]
    gpad = np.zeros((N, C) + tuple(size), dtype=gy.dtype)
    dst, src = [], []
    for a in range(nd):
        s_, off = int(strides[a]), (ksh[a] - 1) * dilations[a] - int(pb[a])
        o_lo = max(0, -(off // s_))                      # first o with off + o*s >= 0
        o_hi = min(O[a], (size[a] - 1 - off) // s_ + 1)  # one past the last that fits
        if o_hi <= o_lo:
            return np.zeros(tuple(x_shape), dtype=gy.dtype)
        dst.append(slice(off + o_lo * s_, off + (o_hi - 1) * s_ + 1, s_))
        src.append(slice(o_lo, o_hi))
    gpad[(slice(None), slice(None)) + tuple(dst)] = gy[(slice(None), slice(None)) + tuple(src)]
    wflip = np.ascontiguousarray(w[(slice(None), slice(None)) + (slice(None, None, -1),) * nd])
    return _depthwise(gpad, wflip, None, [1] * nd, list(dilations), [0] * nd, [0] * nd,
                      [0] * nd, X)


def _depthwise(x, w, b, strides, dilations, pb, pe, extra, out_shape, epi=None):
    """Depthwise conv (group == C == M).

    Per block of channels, images and output rows, the kernel taps (contiguous slices of the
    phase-split input, see :class:`WideTaps`) are copied into a small cache-resident im2col
    block and one batched matmul (a ``(1, K) @ (K, n)`` product per channel) does the
    multiply-adds. Blocks are spread over threads; each BLAS call stays small enough to run
    on the calling thread. 2-D float32 on numpy: the compiled ``conv_grad.dw_fwd_*`` kernels
    when they are loaded (the training step's NCHW depthwise layers).
    """
    xp = xp_of(x, w)
    N, C = x.shape[:2]
    y = _depthwise_compiled(x, w, b, strides, dilations, pb, out_shape) if xp is np else None
    if y is not None:
        if epi is not None:  # the bias is already in
            Epilogue(None, epi.z, epi.activation, epi.alpha, epi.beta)(y.reshape(N, C, -1))
        return y
    ksh = tuple(w.shape[2:])
    nd = len(ksh)
    pe_all = [e + x_ for e, x_ in zip(pe, extra)]
    dt = x.dtype
    K = int(math.prod(ksh))
    wide = WideTaps(x, pb, pe_all, 0, ksh, strides, dilations, out_shape)
    views = wide.views()
    L, rowlen, rows = wide.L, wide.rowlen, out_shape[0]
    bias = None if b is None else b.reshape((1, C) + (1,) * nd)
    if xp is not np:  # one launch per tap over the whole tensor
        wt = w.reshape(C, K)
        acc = views[0] * wt[:, 0].reshape(1, C, 1)
        for t in range(1, K):
            acc += views[t] * wt[:, t].reshape(1, C, 1)
        y = wide.valid(acc)
        y = xp.ascontiguousarray(y + bias if bias is not None else y)
        if epi is not None:  # the bias is already in
            Epilogue(None, epi.z, epi.activation, epi.alpha, epi.beta)(y.reshape(N, C, -1))
        return y
    nb, rb, G, jobs = _dw_jobs(N, C, rows, rowlen, L, K)
    w3 = w.reshape(C, 1, K)
    y = xp.empty((N, C) + tuple(out_shape), dtype=dt)

    def work(chunk):
        seg = rb * rowlen
        cols = xp.empty((G, K, nb, seg), dtype=dt)
        acc = xp.empty((G, nb * seg), dtype=dt)
        for c0, c1, n0, n1, r0, r1 in chunk:
            g, m, n = c1 - c0, n1 - n0, (r1 - r0) * rowlen
            cb = cols[:g, :, :m, :n]
            lo = r0 * rowlen
            for t, v in enumerate(views):
                xp.copyto(cb[:, t], v[n0:n1, c0:c1, lo:lo + n].swapaxes(0, 1))
            a = acc[:g, :m * n]
            xp.matmul(w3[c0:c1], cb.reshape(g, K, m * n), out=a.reshape(g, 1, m * n))
            valid = wide.valid(a.reshape(g, m, n)).swapaxes(0, 1)
            dst = y[n0:n1, c0:c1, r0:r1]
            if bias is None:
                xp.copyto(dst, valid)
            else:
                xp.add(valid, bias[:, c0:c1], out=dst)
            if rest is not None:  # whole output rows: (images, channels, positions) view
                rest(dst.reshape(m, g, -1), slice(n0, n1), slice(r0 * per_row, r1 * per_row),
                     slice(c0, c1))

    rest = None if epi is None else Epilogue(None, epi.z, epi.activation, epi.alpha, epi.beta)
    per_row = int(math.prod(out_shape[1:]))
    with single_threaded_blas(blas_controller()):
        run_blocks(xp, jobs, work, 2 * K * C * N * L)
    return y


def _depthwise_compiled(x, w, b, strides, dilations, pb, out_shape):
    """The 2-D float32 depthwise convolution by the compiled kernels (channels split over the
    worker threads), or None when they do not apply (horizontal stride 1 or 2 only) or are not
    loaded."""
    if x.ndim != 4 or x.dtype != np.float32 or w.dtype != np.float32 or \
            int(strides[1]) not in (1, 2) or (b is not None and b.dtype != np.float32):
        return None
    sw = int(strides[1])
    kern = compiled.kernel(f"conv_grad.dw_fwd_s{sw}")
    if kern is None:
        return None
    N, C, H, W = (int(v) for v in x.shape)
    kh, kw = (int(v) for v in w.shape[2:])
    OH, OW = (int(v) for v in out_shape)
    y = np.empty((N, C, OH, OW), dtype=np.float32)
    if y.size == 0:
        return y
    xc = np.ascontiguousarray(x)
    wc = np.ascontiguousarray(w).reshape(C, kh, kw)
    bc = np.zeros(C, np.float32) if b is None else np.ascontiguousarray(b).reshape(C)
    geo = (N, C, H, W, OH, OW, kh, kw, int(strides[0]), sw, int(dilations[0]),
           int(dilations[1]), int(pb[0]), int(pb[1]))
    step = max(1, -(-C // (4 * n_workers())))

    def work(chunk):
        for c0, c1 in chunk:
            kern(xc, wc, bc, y, *geo, c0, c1)
    run_blocks(np, [(i, min(C, i + step)) for i in range(0, C, step)], work,
               N * C * OH * OW * kh * kw)
    return y


def _check_conv_inputs(op, X, W, B, group):
    if X.ndim < 3:
        raise ShapeError(f"{op}: input X must have shape (N, C, D1, ...) with at least one "
                         f"spatial axis, got shape {tuple(X.shape)}")
    if W.ndim != X.ndim:
        raise ShapeError(f"{op}: weight W has rank {W.ndim} but X has rank {X.ndim} "
                         f"(X {tuple(X.shape)}, W {tuple(W.shape)})")
    if group < 1:
        raise InputError(f"{op}: group={group} must be >= 1")
    C, M = X.shape[1], W.shape[0]
    if W.shape[1] * group != C or M % group:
        raise ShapeError(f"{op}: X has {C} channels and W has shape {tuple(W.shape)} with "
                         f"group={group}; need W.shape[1] * group == C and W.shape[0] "
                         f"divisible by group")
    if B is not None and tuple(B.shape) != (M,):
        raise ShapeError(f"{op}: bias B must have shape ({M},), got {tuple(B.shape)}")


def _kernel_from(op, W, kernel_shape, first_spatial=2):
    ks = tuple(int(k) for k in W.shape[first_spatial:])
    if kernel_shape is not None and len(kernel_shape) and tuple(kernel_shape) != ks:
        raise ShapeError(f"{op}: attribute kernel_shape={list(kernel_shape)} does not match "
                         f"the weight's spatial shape {list(ks)}")
    return ks


# --------------------------------------------------------------------------------------------
# Conv
# --------------------------------------------------------------------------------------------

@kernel("Conv", since=1, category="layer")
def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None, epi=None):
    """ONNX Conv (1-D/2-D/3-D...): im2col + matmul, with 1x1 and depthwise fast paths.
    ``epi`` (internal, FusedConv): an :class:`Epilogue` for the residual and activation."""
    _check_conv_inputs("Conv", X, W, B, int(group))
    nd = X.ndim - 2
    ks = _kernel_from("Conv", W, kernel_shape)
    st = spatial_ints("Conv", "strides", strides, nd, 1)
    dl = spatial_ints("Conv", "dilations", dilations, nd, 1)
    pb, pe, out, extra = window_geometry("Conv", X.shape[2:], ks, st, dl, pads, auto_pad)
    x, w = to_compute(X), to_compute(W)
    if w.dtype != x.dtype:
        w = w.astype(x.dtype)
    b = None if B is None else B.astype(x.dtype, copy=False)
    if epi is not None and epi.z is not None and \
            tuple(epi.z.shape) != (X.shape[0], W.shape[0], *out):
        # a residual that broadcasts: added (and the activation applied) afterwards
        y = conv_core(x, w, b, int(group), st, dl, pb, pe, extra, out)
        if np.broadcast_shapes(tuple(y.shape), tuple(epi.z.shape)) == tuple(y.shape):
            y += epi.z.astype(y.dtype, copy=False)
        else:  # Z is the larger operand (Add broadcasts both ways)
            y = (y + epi.z).astype(y.dtype, copy=False)
        y = apply_activation(y, epi.activation, epi.alpha, epi.beta)
    else:
        y = conv_core(x, w, b, int(group), st, dl, pb, pe, extra, out, epi)
    return y if y.dtype == X.dtype else y.astype(X.dtype)


# --------------------------------------------------------------------------------------------
# FusedConv (internal: made by the inference pass workbench.graph.passes.fuse_conv_activation)
# --------------------------------------------------------------------------------------------

#: the activations FusedConv applies in its epilogue (what fuse_conv_activation may fuse)
EPILOGUE_ACTIVATIONS = frozenset(("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "Tanh"))


def apply_activation(y, activation, alpha=0.0, beta=0.0):
    """``activation`` (Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, Tanh or "") applied to the
    float array ``y`` in place; returns ``y``."""
    xp = xp_of(y)
    if not activation:
        return y
    if activation == "Relu":
        if xp is np and y.dtype.kind == "f" and y.itemsize >= 4:
            # clip with an infinite top bound: numpy's fastest form (about 3x maximum(y, 0)
            # on a cache-resident float32 piece); NaN stays NaN as in maximum
            np.clip(y, y.dtype.type(0), y.dtype.type(np.inf), out=y)
        else:
            xp.maximum(y, 0, out=y)
    elif activation == "LeakyRelu":
        xp.multiply(y, y.dtype.type(alpha), out=y, where=y < 0)
    elif activation == "Clip":
        xp.clip(y, y.dtype.type(alpha), y.dtype.type(beta), out=y)
    elif activation == "Sigmoid":
        with quiet():
            xp.negative(y, out=y)
            xp.exp(y, out=y)
            y += 1
            xp.reciprocal(y, out=y)
    elif activation == "HardSigmoid":
        y *= y.dtype.type(alpha)
        y += y.dtype.type(beta)
        xp.clip(y, 0, 1, out=y)
    elif activation == "Tanh":
        xp.tanh(y, out=y)
    else:
        raise InputError(f"FusedConv: unknown activation {activation!r}")
    return y


@kernel("FusedConv", since=1, domain=FUSED_DOMAIN)
def fused_conv(X, W, B=None, Z=None, *, activation="", activation_params=(),
               auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
               strides=None):
    """Conv, then ``+ Z`` (a residual, optional), then ``activation`` with its
    ``activation_params`` (alpha[, beta]; Clip: min, max) -- one node for Conv -> Add -> Relu
    and the like, so that the epilogue runs in the output's single pass."""
    p = [float(v) for v in (activation_params or ())] + [0.0, 0.0]
    # the epilogue runs on each piece of the output in the worker that computed it
    return conv(X, W, B, epi=Epilogue(None, Z, activation, p[0], p[1]),
                auto_pad=auto_pad, dilations=dilations, group=group,
                kernel_shape=kernel_shape, pads=pads, strides=strides)


@kernel("ConvInteger", since=10, category="layer")
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ONNX ConvInteger: (x - x_zp) conv (w - w_zp) accumulated exactly, int32 output."""
    xp = xp_of(x, w)
    _check_conv_inputs("ConvInteger", x, w, None, int(group))
    nd = x.ndim - 2
    M = w.shape[0]
    ks = _kernel_from("ConvInteger", w, kernel_shape)
    st = spatial_ints("ConvInteger", "strides", strides, nd, 1)
    dl = spatial_ints("ConvInteger", "dilations", dilations, nd, 1)
    pb, pe, out, extra = window_geometry("ConvInteger", x.shape[2:], ks, st, dl, pads, auto_pad)
    # float64 holds every partial sum exactly (|term| < 2**16) and runs on BLAS
    xf = x.astype(xp.float64)
    if x_zero_point is not None:
        if x_zero_point.size != 1:
            raise ShapeError(f"ConvInteger: x_zero_point must be a scalar (per-tensor), got "
                             f"shape {tuple(x_zero_point.shape)}")
        xf -= x_zero_point.reshape(()).astype(xp.float64)
    wf = w.astype(xp.float64)
    if w_zero_point is not None:
        if w_zero_point.size == 1:
            wf -= w_zero_point.reshape(()).astype(xp.float64)
        elif w_zero_point.size == M:
            wf -= w_zero_point.reshape((M,) + (1,) * (w.ndim - 1)).astype(xp.float64)
        else:
            raise ShapeError(f"ConvInteger: w_zero_point must be a scalar or have {M} values "
                             f"(one per output channel), got shape "
                             f"{tuple(w_zero_point.shape)}")
    y = conv_core(xf, wf, None, int(group), st, dl, pb, pe, extra, out)
    return xp.rint(y).astype(xp.int32)


# --------------------------------------------------------------------------------------------
# ConvTranspose and Col2Im (col2im scatter)
# --------------------------------------------------------------------------------------------

def _col2im_add(buf, cols, strides, dilations, offset):
    """buf[..., offset + k*d + s*i] += cols[..., k, i] over every kernel tap ``k``.

    ``buf`` is (N, C, *S); ``cols`` is (N, C, *kernel, *blocks).
    """
    nd = buf.ndim - 2
    ksh = cols.shape[2:2 + nd]
    blocks = cols.shape[2 + nd:]
    for tap in itertools.product(*[range(k) for k in ksh]):
        sl = (slice(None), slice(None)) + tuple(
            slice(o + t * d, o + t * d + (n - 1) * s + 1, s)
            for o, t, d, n, s in zip(offset, tap, dilations, blocks, strides))
        buf[sl] += cols[(slice(None), slice(None)) + tap]


def _conv_transpose(X, W, B, auto_pad, dilations, group, kernel_shape, output_padding,
                    output_shape, pads, strides, upper_puts_extra_at_end):
    op = "ConvTranspose"
    xp = xp_of(X, W)
    group = int(group)
    if X.ndim < 3 or W.ndim != X.ndim:
        raise ShapeError(f"{op}: X must be (N, C, D1, ...) and W (C, M/group, k1, ...) of the "
                         f"same rank, got X {tuple(X.shape)}, W {tuple(W.shape)}")
    N, C = X.shape[:2]
    if W.shape[0] != C or C % group:
        raise ShapeError(f"{op}: W.shape[0] must equal the {C} input channels and be divisible "
                         f"by group={group}, got W {tuple(W.shape)}")
    nd = X.ndim - 2
    ks = _kernel_from(op, W, kernel_shape)
    Mg = W.shape[1]
    M = Mg * group
    if B is not None and tuple(B.shape) != (M,):
        raise ShapeError(f"{op}: bias B must have shape ({M},), got {tuple(B.shape)}")
    st = spatial_ints(op, "strides", strides, nd, 1)
    dl = spatial_ints(op, "dilations", dilations, nd, 1)
    op_ = spatial_ints(op, "output_padding", output_padding, nd, 0)
    ap = norm_auto_pad(op, auto_pad)
    ins = [int(v) for v in X.shape[2:]]
    eff = [(k - 1) * d + 1 for k, d in zip(ks, dl)]
    natural = [s * (i - 1) + o + e for s, i, o, e in zip(st, ins, op_, eff)]
    # the full (natural) output is scattered into before cropping: refuse it before that
    check_alloc([N, M, *natural], compute_dtype(X.dtype), what=f"{op}: the full output")
    if output_shape is not None and len(output_shape):
        osh = [int(v) for v in output_shape][-nd:]
        if len(osh) != nd:
            raise ShapeError(f"{op}: output_shape={list(output_shape)} needs {nd} values")
    elif ap in ("SAME_UPPER", "SAME_LOWER"):
        osh = [i * s for i, s in zip(ins, st)]
    else:
        osh = None
    if osh is not None:
        total = [n - o for n, o in zip(natural, osh)]
        if (ap == "SAME_UPPER") == upper_puts_extra_at_end:
            pb = [t // 2 for t in total]
        else:
            pb = [t - t // 2 for t in total]
    else:
        if ap == "VALID" or pads is None or len(pads) == 0:
            p = [0] * (2 * nd)
        else:
            p = [int(v) for v in pads]
            if len(p) != 2 * nd:
                raise ShapeError(f"{op}: attribute pads={p} needs {2 * nd} values")
        pb = p[:nd]
        osh = [n - b - e for n, b, e in zip(natural, p[:nd], p[nd:])]
        if any(o < 0 for o in osh):
            raise ShapeError(f"{op}: pads={p} are larger than the full output {natural}")
    check_alloc([N, M, *osh], compute_dtype(X.dtype), what=f"{op}: the output")

    x = to_compute(X)
    w = to_compute(W).astype(x.dtype, copy=False)
    K = int(math.prod(ks))
    IN = int(math.prod(ins))
    # columns: (N, group, Mg*K, IN) = W_g^T @ X_g
    wt = w.reshape(group, C // group, Mg * K).transpose(0, 2, 1)
    mm = fixed_matmul if exact_products_active() else parallel_matmul   # (see conv_core)
    cols = mm(xp, wt, x.reshape(N, group, C // group, IN))
    cols = cols.reshape((N, M) + tuple(ks) + tuple(ins))
    full = [s * (i - 1) + e for s, i, e in zip(st, ins, eff)]
    lo = [min(0, b) for b in pb]
    hi = [max(f, b + o) for f, b, o in zip(full, pb, osh)]
    buf = xp.zeros((N, M) + tuple(h - l_ for h, l_ in zip(hi, lo)), dtype=x.dtype)
    _col2im_add(buf, cols, st, dl, [-l_ for l_ in lo])
    sl = (slice(None), slice(None)) + tuple(
        slice(b - l_, b - l_ + o) for b, l_, o in zip(pb, lo, osh))
    y = buf[sl]
    if B is not None:
        y = y + B.astype(x.dtype).reshape((1, M) + (1,) * nd)
    else:
        y = xp.ascontiguousarray(y)
    return y if y.dtype == X.dtype else y.astype(X.dtype)


@kernel("ConvTranspose", since=1, category="layer")
def conv_transpose_1(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                     kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                     strides=None):
    """ConvTranspose-1: with output_shape/SAME, SAME_UPPER puts the odd padding at the start."""
    return _conv_transpose(X, W, B, auto_pad, dilations, group, kernel_shape, output_padding,
                           output_shape, pads, strides, upper_puts_extra_at_end=False)


@kernel("ConvTranspose", since=11)
def conv_transpose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    """ConvTranspose-11+: matmul then col2im; SAME_UPPER puts the odd padding at the end."""
    return _conv_transpose(X, W, B, auto_pad, dilations, group, kernel_shape, output_padding,
                           output_shape, pads, strides, upper_puts_extra_at_end=True)


@kernel("Col2Im", since=18, host_read_inputs=(1, 2))
def col2im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im: sum column blocks (N, C*prod(block), L) back into (N, C, *image_shape)."""
    op = "Col2Im"
    xp = xp_of(input)
    img = [int(v) for v in image_shape.reshape(-1).tolist()]
    blk = [int(v) for v in block_shape.reshape(-1).tolist()]
    nd = len(img)
    if len(blk) != nd:
        raise ShapeError(f"{op}: image_shape {img} and block_shape {blk} must have the same "
                         f"length")
    if input.ndim != 3:
        raise ShapeError(f"{op}: input must be 3-D (N, C*prod(block_shape), L), got shape "
                         f"{tuple(input.shape)}")
    st = spatial_ints(op, "strides", strides, nd, 1)
    dl = spatial_ints(op, "dilations", dilations, nd, 1)
    pb, pe, nblocks, _ = window_geometry(op, img, blk, st, dl, pads, "NOTSET")
    K = int(math.prod(blk))
    N, CK, L = (int(v) for v in input.shape)
    if K == 0 or CK % K:
        raise ShapeError(f"{op}: input dimension 1 ({CK}) must be a multiple of "
                         f"prod(block_shape)={K}")
    if L != int(math.prod(nblocks)):
        raise ShapeError(f"{op}: input has L={L} blocks but image_shape {img}, block_shape "
                         f"{blk}, pads, strides and dilations give {nblocks} "
                         f"= {int(math.prod(nblocks))} blocks")
    C = CK // K
    dtype = input.dtype
    acc_dtype = compute_dtype(dtype) if dtype.kind == "f" or dtype.name == "bfloat16" else dtype
    cols = input.astype(acc_dtype, copy=False).reshape((N, C) + tuple(blk) + tuple(nblocks))
    padded = [i + b + e for i, b, e in zip(img, pb, pe)]
    buf = xp.zeros((N, C) + tuple(padded), dtype=acc_dtype)
    _col2im_add(buf, cols, st, dl, [0] * nd)
    y = buf[(slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(pb, img))]
    return xp.ascontiguousarray(y).astype(dtype, copy=False)


# --------------------------------------------------------------------------------------------
# DeformConv
# --------------------------------------------------------------------------------------------

def _deform_conv(X, W, offset, B, mask, dilations, group, kernel_shape, offset_group, pads,
                 strides):
    op = "DeformConv"
    xp = xp_of(X, W, offset)
    group, offset_group = int(group), int(offset_group)
    _check_conv_inputs(op, X, W, B, group)
    N, C = X.shape[:2]
    M = W.shape[0]
    nd = X.ndim - 2
    ks = _kernel_from(op, W, kernel_shape)
    K = int(math.prod(ks))
    st = spatial_ints(op, "strides", strides, nd, 1)
    dl = spatial_ints(op, "dilations", dilations, nd, 1)
    pb, pe, out, _ = window_geometry(op, X.shape[2:], ks, st, dl, pads, "NOTSET")
    G = offset_group
    if G < 1 or C % G:
        raise ShapeError(f"{op}: offset_group={G} must divide the {C} input channels")
    exp_off = (N, G * K * nd) + tuple(out)
    if tuple(offset.shape) != exp_off:
        raise ShapeError(f"{op}: offset must have shape {exp_off} (N, offset_group*prod(kernel)"
                         f"*{nd}, *output spatial), got {tuple(offset.shape)}")
    if mask is not None and tuple(mask.shape) != (N, G * K) + tuple(out):
        raise ShapeError(f"{op}: mask must have shape {(N, G * K) + tuple(out)}, got "
                         f"{tuple(mask.shape)}")
    x = to_compute(X)
    dt = x.dtype
    ins = [int(v) for v in X.shape[2:]]
    OUT = int(math.prod(out))
    off = offset.astype(dt).reshape((N, G, K, nd, OUT))
    msk = None if mask is None else mask.astype(dt).reshape(N, G, K, OUT)
    # sampling positions: base (-pad + o*s + k*d) + offset, per axis -> (N, G, K, OUT)
    grids = xp.meshgrid(*[xp.arange(o) for o in out], indexing="ij")
    taps = xp.meshgrid(*[xp.arange(k) for k in ks], indexing="ij")
    pos = []
    for a in range(nd):
        base = (grids[a].reshape(1, OUT) * st[a] - pb[a]) + taps[a].reshape(K, 1) * dl[a]
        pos.append(base.astype(dt)[None, None] + off[:, :, :, a])
    Cg_off = C // G
    xg = x.reshape(N, G, Cg_off, int(math.prod(ins)))
    sampled = xp.zeros((N, G, Cg_off, K, OUT), dtype=dt)
    lows = [xp.floor(p) for p in pos]
    fracs = [p - lo for p, lo in zip(pos, lows)]
    lows = [lo.astype(xp.int64) for lo in lows]
    n_idx = xp.arange(N).reshape(N, 1, 1, 1)
    g_idx = xp.arange(G).reshape(1, G, 1, 1)
    for corner in itertools.product((0, 1), repeat=nd):
        weight = None
        valid = None
        flat = None
        for a, c in enumerate(corner):
            idx = lows[a] + c
            wa = fracs[a] if c else 1 - fracs[a]
            va = (idx >= 0) & (idx < ins[a])
            weight = wa if weight is None else weight * wa
            valid = va if valid is None else valid & va
            idx_c = xp.clip(idx, 0, ins[a] - 1)
            flat = idx_c if flat is None else flat * ins[a] + idx_c
        weight = xp.where(valid, weight, 0)
        # gather (N, G, K, OUT) positions for every channel of the offset group
        vals = xg[n_idx, g_idx, :, flat]  # (N, G, K, OUT, Cg_off)
        sampled += xp.moveaxis(vals, -1, 2) * weight[:, :, None]
    if msk is not None:
        sampled *= msk[:, :, None]
    cols = sampled.reshape(N, group, C // group, K, OUT).reshape(N, group, (C // group) * K,
                                                                   OUT)
    w = to_compute(W).astype(dt, copy=False).reshape(group, M // group, (C // group) * K)
    mm = fixed_matmul if exact_products_active() else parallel_matmul   # (see conv_core)
    y = mm(xp, w, cols).reshape((N, M) + tuple(out))
    if B is not None:
        y += B.astype(dt).reshape((1, M) + (1,) * nd)
    return y if y.dtype == X.dtype else y.astype(X.dtype)


@kernel("DeformConv", since=19, category="layer")
def deform_conv(X, W, offset, B=None, mask=None, *, dilations=None, group=1,
                kernel_shape=None, offset_group=1, pads=None, strides=None):
    """ONNX DeformConv (N-D): bilinear (multilinear) sampling at offset taps, then a matmul."""
    return _deform_conv(X, W, offset, B, mask, dilations, group, kernel_shape, offset_group,
                        pads, strides)


# --------------------------------------------------------------------------------------------
# CausalConvWithState
# --------------------------------------------------------------------------------------------

@kernel("CausalConvWithState", since=27)
def causal_conv_with_state(input, weight, bias=None, past_state=None, *, activation="none"):
    """Stateful causal depthwise 1-D conv: output over [past_state, input], new state = tail."""
    op = "CausalConvWithState"
    xp = xp_of(input, weight)
    act = (activation or "none").lower()
    if act not in ("none", "silu", "swish"):
        raise InputError(f"{op}: activation={activation!r} is not supported "
                         f"(supported: 'none', 'silu', 'swish')")
    if input.ndim != 3 or weight.ndim != 3 or weight.shape[1] != 1 \
            or weight.shape[0] != input.shape[1]:
        raise ShapeError(f"{op}: input must be (batch, channels, length) and weight "
                         f"(channels, 1, k); got input {tuple(input.shape)}, weight "
                         f"{tuple(weight.shape)}")
    Bn, C, L = (int(v) for v in input.shape)
    k = int(weight.shape[2])
    if k < 1:
        raise ShapeError(f"{op}: kernel length must be >= 1, got weight {tuple(weight.shape)}")
    x = to_compute(input)
    if past_state is None:
        past = xp.zeros((Bn, C, k - 1), dtype=x.dtype)
    else:
        if tuple(past_state.shape) != (Bn, C, k - 1):
            raise ShapeError(f"{op}: past_state must have shape {(Bn, C, k - 1)}, got "
                             f"{tuple(past_state.shape)}")
        past = past_state.astype(x.dtype)
    full = xp.concatenate([past, x], axis=2)
    w = to_compute(weight).astype(x.dtype, copy=False)
    y = full[:, :, 0:L] * w[:, 0, 0].reshape(1, C, 1)
    for j in range(1, k):
        y += full[:, :, j:j + L] * w[:, 0, j].reshape(1, C, 1)
    if bias is not None:
        y += bias.astype(x.dtype).reshape(1, C, 1)
    if act != "none":  # silu(y) = y * sigmoid(y), written with tanh so it cannot overflow
        y = y * (0.5 * (1 + xp.tanh(0.5 * y)))
    present = xp.ascontiguousarray(full[:, :, full.shape[2] - (k - 1):])
    return y.astype(input.dtype, copy=False), present.astype(input.dtype, copy=False)
