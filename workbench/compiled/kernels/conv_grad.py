"""2-D depthwise convolutions (group == C == M) on channels-first (NCHW) float32 arrays, the
layout a training step runs in: their gradients, and the forward that the step runs with them;
and MaxPool's gradient.

- ``dw_fwd``: Y (N, C, OH, OW) = the depthwise convolution of X (N, C, H, W) with W (C, KH,
  KW) plus the bias (C,) (zeros for none): a gather over each output row, taps in the
  padding skipped.

- ``dw_dx``: dL/dX, (N, C, H, W), from dL/dY (N, C, OH, OW) and W (C, KH, KW): every output
  gradient scattered back onto the inputs its window read, ``dx[ih, iw] += gy[oh, ow] *
  w[i, j]`` with ``ih = oh * SH - pt + i * DH`` (likewise iw); taps that fall into the padding
  are skipped (the range of ``ow`` whose column is inside the input is computed per tap, so
  the inner loop has no test).
- ``dw_dw``: dL/dW, (C, KH, KW): ``sum over n, oh, ow of x[ih, iw] * gy[oh, ow]`` per tap:
  the products are added into a row of OW float32 lanes over (n, oh) (an element-wise add
  that vectorises; a plain float reduction does not without reordering the sum), the lanes
  summed in float64 at the end; ``acc`` is that row (OW floats, the caller's scratch).
- ``_s1`` / ``_s2``: the horizontal stride as a literal (the vertical stride, dilations and
  pads are arguments); other horizontal strides run on the numpy path (a general form would
  add ~30 s to every cold build for layers no zoo network has).

The inner loops index one row with **unsigned** indices (``uint64``): with signed ones numba
adds a negative-index wrap-around to every access and LLVM's vectoriser gives up (measured:
1.3-1.8x slower than the numpy path on MobileNetV2's stride-1 layers at batch 8; with them,
0.25-0.5x of it, 2-core AVX2 EPYC, CPU time). Every index there is >= 0 by construction.

- ``maxpool_dx``: dL/dX of a 2-D MaxPool, (N*C, H, W) planes ``p0 <= p < p1``, from X, Y and
  dL/dY: each output's gradient goes to the first input of its window (taps in scan order,
  padding skipped) equal to the output; outputs are visited in reverse scan order, so that an
  input shared by several windows receives their gradients in increasing tap order (the sums
  of ``autodiff.rules.pool``'s numpy path, bit for bit). A window with no input equal to its
  output (NaN) sets ``miss[0] = 1``: the caller then runs the numpy reference.

The depthwise kernels compute the channels ``c0 <= c < c1`` (all images of each), so the
engine's threads split the work by channel and never write the same element. Any stride,
dilation and (asymmetric) padding; NaN and Inf propagate as in numpy's sums.
"""

from numba import carray, njit, uint64

from workbench.compiled.build import export

_ARGS = ("f32[] f32[] f32[]! i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 "
         "i64")


@njit(inline="always")
def _ow_range(j, DW, pl, SW, W, OW):
    """(off, lo, hi): the outputs ``lo <= ow < hi`` whose tap j reads column ``ow * SW + off``
    inside the input."""
    off = j * DW - pl
    lo = 0
    if off < 0:
        lo = (-off + SW - 1) // SW
    hi = OW
    if W - 1 - off < 0:
        hi = 0
    elif (W - 1 - off) // SW + 1 < hi:
        hi = (W - 1 - off) // SW + 1
    return off, lo, hi


@njit(inline="always", error_model="numpy", fastmath={"contract"})
def _dx(gyp, wp, dxp, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    gy = carray(gyp, (N, C, OH, OW))
    w = carray(wp, (C, KH, KW))
    dx = carray(dxp, (N, C, H, W))
    for n in range(N):
        for c in range(c0, c1):
            for ih in range(H):
                for iw in range(W):
                    dx[n, c, ih, iw] = 0.0
            for i in range(KH):
                for j in range(KW):
                    wv = w[c, i, j]
                    off, lo, hi = _ow_range(j, DW, pl, SW, W, OW)
                    for oh in range(OH):
                        ih = oh * SH - pt + i * DH
                        if ih < 0 or ih >= H:
                            continue
                        drow = dx[n, c, ih]
                        grow = gy[n, c, oh]
                        for ow in range(lo, hi):
                            drow[uint64(ow * SW + off)] += grow[uint64(ow)] * wv


@njit(inline="always", error_model="numpy", fastmath={"contract"})
def _dw(xp, gyp, dwp, accp, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    x = carray(xp, (N, C, H, W))
    gy = carray(gyp, (N, C, OH, OW))
    dw = carray(dwp, (C, KH, KW))
    acc = carray(accp, (OW,))
    for c in range(c0, c1):
        for i in range(KH):
            for j in range(KW):
                off, lo, hi = _ow_range(j, DW, pl, SW, W, OW)
                for ow in range(OW):
                    acc[ow] = 0.0
                for n in range(N):
                    for oh in range(OH):
                        ih = oh * SH - pt + i * DH
                        if ih < 0 or ih >= H:
                            continue
                        xrow = x[n, c, ih]
                        grow = gy[n, c, oh]
                        for ow in range(lo, hi):
                            acc[uint64(ow)] += xrow[uint64(ow * SW + off)] * grow[uint64(ow)]
                s = 0.0
                for ow in range(lo, hi):
                    s += acc[ow]
                dw[c, i, j] = s


@export("dw_dx_s2", _ARGS)
def dw_dx_s2(gy, w, dx, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    _dx(gy, w, dx, N, C, H, W, OH, OW, KH, KW, SH, 2, DH, DW, pt, pl, c0, c1)


_DW_ARGS = "f32[] f32[] f32[]! f32[]! " + _ARGS.split(None, 3)[3]


@export("dw_dw_s2", _DW_ARGS)
def dw_dw_s2(x, gy, dw, acc, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    _dw(x, gy, dw, acc, N, C, H, W, OH, OW, KH, KW, SH, 2, DH, DW, pt, pl, c0, c1)


@export("dw_dx_s1", _ARGS)
def dw_dx_s1(gy, w, dx, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    _dx(gy, w, dx, N, C, H, W, OH, OW, KH, KW, SH, 1, DH, DW, pt, pl, c0, c1)


@export("dw_dw_s1", _DW_ARGS)
def dw_dw_s1(x, gy, dw, acc, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    _dw(x, gy, dw, acc, N, C, H, W, OH, OW, KH, KW, SH, 1, DH, DW, pt, pl, c0, c1)


@njit(inline="always", error_model="numpy", fastmath={"contract"})
def _fwd(xp, wp, bp, yp, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    x = carray(xp, (N, C, H, W))
    w = carray(wp, (C, KH, KW))
    b = carray(bp, (C,))
    y = carray(yp, (N, C, OH, OW))
    for n in range(N):
        for c in range(c0, c1):
            for oh in range(OH):
                yrow = y[n, c, oh]
                bc = b[c]
                for ow in range(OW):
                    yrow[uint64(ow)] = bc
                for i in range(KH):
                    ih = oh * SH - pt + i * DH
                    if ih < 0 or ih >= H:
                        continue
                    xrow = x[n, c, ih]
                    for j in range(KW):
                        wv = w[c, i, j]
                        off, lo, hi = _ow_range(j, DW, pl, SW, W, OW)
                        for ow in range(lo, hi):
                            yrow[uint64(ow)] += xrow[uint64(ow * SW + off)] * wv


@export("dw_fwd_s1", _ARGS.replace("f32[]!", "f32[] f32[]!", 1))
def dw_fwd_s1(x, w, b, y, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    _fwd(x, w, b, y, N, C, H, W, OH, OW, KH, KW, SH, 1, DH, DW, pt, pl, c0, c1)


@export("dw_fwd_s2", _ARGS.replace("f32[]!", "f32[] f32[]!", 1))
def dw_fwd_s2(x, w, b, y, N, C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, c0, c1):
    _fwd(x, w, b, y, N, C, H, W, OH, OW, KH, KW, SH, 2, DH, DW, pt, pl, c0, c1)


@njit(inline="always")
def _tap_range(o, S, D, pad, K, size):
    """(lo, hi, first): the taps ``lo <= t < hi`` of output ``o`` inside the input, the input
    index of tap 0 being ``first``."""
    first = o * S - pad
    lo = 0
    while lo < K and first + lo * D < 0:   # a few taps: no division per output
        lo += 1
    hi = K
    while hi > lo and first + (hi - 1) * D >= size:
        hi -= 1
    return lo, hi, first


@njit(inline="always", error_model="numpy")
def _maxpool_dx(xp, yp, gp, gxp, missp, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, p0, p1):
    x = carray(xp, (p1 * H * W,))
    y = carray(yp, (p1 * OH * OW,))
    g = carray(gp, (p1 * OH * OW,))
    gx = carray(gxp, (p1 * H * W,))
    miss = carray(missp, (1,))
    for p in range(p0, p1):
        xb = p * H * W
        yb = p * OH * OW
        for t in range(xb, xb + H * W):
            gx[uint64(t)] = 0.0
        # outputs in reverse scan order: the outputs whose windows share an input reach it
        # in increasing tap order, the order in which the numpy path adds them
        for oh in range(OH):
            ilo, ihi, ih0 = _tap_range(OH - 1 - oh, SH, DH, pt, KH, H)
            for ow in range(OW):
                jlo, jhi, iw0 = _tap_range(OW - 1 - ow, SW, DW, pl, KW, W)
                o = uint64(yb + (OH - 1 - oh) * OW + OW - 1 - ow)
                v = y[o]
                hit = -1
                for i in range(ilo, ihi):
                    row = xb + (ih0 + i * DH) * W + iw0
                    for j in range(jlo, jhi):
                        if x[uint64(row + j * DW)] == v:
                            hit = row + j * DW
                            break
                    if hit >= 0:
                        break
                if hit >= 0:
                    gx[uint64(hit)] += g[o]
                else:
                    miss[0] = 1


@export("maxpool_dx", "f32[] f32[] f32[] f32[]! i64[]! i64 i64 i64 i64 i64 i64 i64 i64 i64 "
        "i64 i64 i64 i64 i64")
def maxpool_dx(x, y, g, gx, miss, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, p0, p1):
    _maxpool_dx(x, y, g, gx, miss, H, W, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, p0, p1)
