"""Convolution kernels on channels-last (NHWC) float32 activations.

- ``dw_k{K}s{S}``: depthwise K x K convolution with stride S (dilation 1), weights laid out
  (K, K, C), fused epilogue ``clip(conv + b + z, lo, hi)`` (``z`` a residual of the output's
  shape when ``has_z``; ``lo``/``hi`` = -inf/inf, 0/inf or 0/6 give none, ReLU, ReLU6). One call
  computes the output rows ``r0 <= n * OH + oh < r1``, so the engine's threads split the work.
  Interior pixels run an unrolled K x K loop per channel (the channel loop is vectorised with
  packed FMAs because K and S are literals here); border pixels accumulate tap by tap.
- ``bias_act``: the same epilogue in place on a (rows, M) block of a 1x1 convolution's GEMM
  output (the product itself is BLAS).

NaN propagates as in numpy's clip (comparisons with NaN are false, so NaN is kept).
"""

from numba import carray, njit

from workbench.compiled.build import export

_DW_ARGS = ("f32[] f32[] f32[] f32[] f32[]! i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 i64 "
            "f32 f32")


@njit(inline="always", error_model="numpy", fastmath={"contract"})
def _dw_rows(xp, wp, bp, zp, yp, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi, S, K):
    x = carray(xp, (N, H, W, C))
    w = carray(wp, (K, K, C))
    b = carray(bp, (C,))
    y = carray(yp, (N, OH, OW, C))
    z = carray(zp, (N, OH, OW, C)) if has_z else carray(zp, (1, 1, 1, C))
    for r in range(r0, r1):
        n = r // OH
        oh = r - n * OH
        ih0 = oh * S - pt
        rows_inside = ih0 >= 0 and ih0 + K <= H
        for ow in range(OW):
            iw0 = ow * S - pl
            if rows_inside and iw0 >= 0 and iw0 + K <= W:
                for c in range(C):
                    a = b[c]
                    for kh in range(K):
                        for kw in range(K):
                            a += x[n, ih0 + kh, iw0 + kw, c] * w[kh, kw, c]
                    y[n, oh, ow, c] = a
            else:
                for c in range(C):
                    y[n, oh, ow, c] = b[c]
                for kh in range(K):
                    ih = ih0 + kh
                    if ih < 0 or ih >= H:
                        continue
                    for kw in range(K):
                        iw = iw0 + kw
                        if iw < 0 or iw >= W:
                            continue
                        for c in range(C):
                            y[n, oh, ow, c] += x[n, ih, iw, c] * w[kh, kw, c]
            if has_z:
                for c in range(C):
                    y[n, oh, ow, c] += z[n, oh, ow, c]
            for c in range(C):
                a = y[n, oh, ow, c]
                if a < lo:
                    a = lo
                if a > hi:
                    a = hi
                y[n, oh, ow, c] = a


@export("dw_k3s1", _DW_ARGS)
def dw_k3s1(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi):
    _dw_rows(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi, 1, 3)


@export("dw_k3s2", _DW_ARGS)
def dw_k3s2(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi):
    _dw_rows(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi, 2, 3)


@export("dw_k5s1", _DW_ARGS)
def dw_k5s1(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi):
    _dw_rows(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi, 1, 5)


@export("dw_k5s2", _DW_ARGS)
def dw_k5s2(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi):
    _dw_rows(x, w, b, z, y, N, H, W, C, OH, OW, pt, pl, has_z, r0, r1, lo, hi, 2, 5)


@export("bias_act", "f32[]! f32[] f32[] i64 i64 i64 i64 i64 f32 f32")
def bias_act(yp, bp, zp, rows, M, has_b, has_z, r0, lo, hi):
    """``y[r0:r0+rows] = clip(y + b + z, lo, hi)`` on a (rows, M) block, in one pass; ``z``
    is read from the same rows of a residual of y's full shape (``zp`` points at its row
    r0)."""
    y = carray(yp, (rows, M))
    b = carray(bp, (M,))
    z = carray(zp, (rows, M)) if has_z else carray(zp, (1, M))
    for r in range(rows):
        zr = r if has_z else 0
        for m in range(M):
            a = y[r, m]
            if has_b:
                a += b[m]
            if has_z:
                a += z[zr, m]
            if a < lo:
                a = lo
            if a > hi:
                a = hi
            y[r, m] = a
