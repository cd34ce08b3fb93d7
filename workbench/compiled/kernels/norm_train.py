"""BatchNormalization in training mode (batch statistics) on float32 channels-first arrays:
the forward's statistics and normalisation and the backward's two passes.

X is seen as rows: ``(R, S)`` with ``R = N * C`` (row ``r`` is image ``r // C``, channel
``r % C``) and ``S`` the spatial size. Every kernel computes the rows ``r0 <= r < r1``, so the
engine's threads split the work by rows and never write the same element; the per-channel
combination over the images (a few thousand numbers) is left to the caller.

- ``bn_stats``: per row, the mean and the sum of squared deviations from that mean (``m2``),
  both in float64: two passes over the row while it is in the cache (the caller combines the
  rows of a channel with Chan's formula, so a large common offset does not cancel the
  variance).
- ``bn_norm``: ``y = (x - mean[c]) * a[c] + b[c]`` (``a = scale / sqrt(var + eps)``).
- ``bn_grad_sums``: per row, ``sum(g)`` and ``sum(g * (x - mean[c]))`` in float64.
- ``bn_grad_dx``: ``dx = g * ca[c] + (x - mean[c]) * cb[c] + cc[c]`` (the per-channel
  coefficients of the training BatchNorm gradient, formed by the caller).
- ``ln_grad``: LayerNormalization's gradient over rows of ``n`` (the normalised trailing axes):
  the row's statistics recomputed (float64, two passes), ``dx = inv * (g gamma - mean(g
  gamma) - xhat mean(g gamma xhat))``; ``g * xhat`` and ``g`` added into row ``part`` of the
  float64 partial sums of dL/dgamma and dL/dbeta (one row per chunk of rows, so the threads
  never write the same element; the caller sums the partial rows).

The sums are reassociated (float64 lanes, which is what lets them vectorise); NaN and Inf
propagate as in numpy's sums (no nnan/ninf flags).
"""

import numpy as np
from numba import carray, uint64

from workbench.compiled.build import export

_FM = ("contract", "reassoc", "nsz")


@export("bn_stats", "f32[] f64[]! f64[]! i64 i64 i64 i64 i64", fastmath=_FM)
def bn_stats(xp, meanp, m2p, R, C, S, r0, r1):
    x = carray(xp, (R, S))
    mean = carray(meanp, (R,))
    m2 = carray(m2p, (R,))
    inv_s = 1.0 / S if S > 0 else 0.0
    for r in range(r0, r1):
        row = x[r]
        s = 0.0
        for j in range(S):
            s += row[uint64(j)]
        mu = s * inv_s
        q = 0.0
        for j in range(S):
            d = row[uint64(j)] - mu
            q += d * d
        mean[r] = mu
        m2[r] = q


@export("bn_norm", "f32[] f32[] f32[] f32[] f32[]! i64 i64 i64 i64 i64",
        fastmath=("contract",))
def bn_norm(xp, meanp, ap, bp, yp, R, C, S, r0, r1):
    x = carray(xp, (R, S))
    y = carray(yp, (R, S))
    mean = carray(meanp, (C,))
    a = carray(ap, (C,))
    b = carray(bp, (C,))
    for r in range(r0, r1):
        c = r % C
        mu, ac, bc = mean[c], a[c], b[c]
        src = x[r]
        dst = y[r]
        for j in range(S):
            dst[uint64(j)] = (src[uint64(j)] - mu) * ac + bc


@export("bn_grad_sums", "f32[] f32[] f32[] f64[]! f64[]! i64 i64 i64 i64 i64", fastmath=_FM)
def bn_grad_sums(xp, gp, meanp, sgp, sgdp, R, C, S, r0, r1):
    x = carray(xp, (R, S))
    g = carray(gp, (R, S))
    mean = carray(meanp, (C,))
    sg = carray(sgp, (R,))
    sgd = carray(sgdp, (R,))
    for r in range(r0, r1):
        mu = mean[r % C]
        xr = x[r]
        gr = g[r]
        s = 0.0
        q = 0.0
        for j in range(S):
            gv = gr[uint64(j)]
            s += gv
            q += gv * (xr[uint64(j)] - mu)
        sg[r] = s
        sgd[r] = q


@export("bn_grad_dx", "f32[] f32[] f32[] f32[] f32[] f32[] f32[]! i64 i64 i64 i64 i64",
        fastmath=("contract",))
def bn_grad_dx(xp, gp, meanp, cap, cbp, ccp, dxp, R, C, S, r0, r1):
    x = carray(xp, (R, S))
    g = carray(gp, (R, S))
    dx = carray(dxp, (R, S))
    mean = carray(meanp, (C,))
    ca = carray(cap, (C,))
    cb = carray(cbp, (C,))
    cc = carray(ccp, (C,))
    for r in range(r0, r1):
        c = r % C
        mu, a, b, k = mean[c], ca[c], cb[c], cc[c]
        xr = x[r]
        gr = g[r]
        dr = dx[r]
        for j in range(S):
            dr[uint64(j)] = gr[uint64(j)] * a + (xr[uint64(j)] - mu) * b + k


@export("ln_grad", "f32[] f32[] f32[] f32[]! f64[]! f64[]! i64 i64 i64 i64 i64 i64 f64",
        fastmath=_FM)
def ln_grad(xp, gp, gammap, dxp, dgp, dbp, rows, n, part, r0, r1, need_dx, eps):
    x = carray(xp, (rows, n))
    g = carray(gp, (rows, n))
    gamma = carray(gammap, (n,))
    dx = carray(dxp, (rows, n)) if need_dx else carray(dxp, (1, 1))
    dgam = carray(dgp, (part + 1, n))[part]
    dbet = carray(dbp, (part + 1, n))[part]
    inv_n = 1.0 / n if n > 0 else 0.0
    for r in range(r0, r1):
        xr = x[r]
        gr = g[r]
        s = 0.0
        for j in range(n):
            s += xr[uint64(j)]
        mu = s * inv_n
        q = 0.0
        for j in range(n):
            d = xr[uint64(j)] - mu
            q += d * d
        inv = 1.0 / np.sqrt(q * inv_n + eps)
        s1 = 0.0
        s2 = 0.0
        for j in range(n):
            xh = (xr[uint64(j)] - mu) * inv
            gv = gr[uint64(j)]
            gh = gv * gamma[uint64(j)]
            s1 += gh
            s2 += gh * xh
            dgam[uint64(j)] += gv * xh
            dbet[uint64(j)] += gv
        if need_dx:
            dr = dx[r]
            a = s1 * inv_n
            b = s2 * inv_n
            for j in range(n):
                xh = (xr[uint64(j)] - mu) * inv
                dr[uint64(j)] = inv * (gr[uint64(j)] * gamma[uint64(j)] - a - xh * b)
