"""Transformer kernels on float32 rows (the last axis): LayerNorm, softmax, GELU.

Every kernel works on a (rows, n) view of C-contiguous arrays and computes the rows
``r0 <= r < r1``, so the engine's threads split the work by rows. Shapes and flags come packed
in one int64 array (``P``, in the order of the names unpacked at the kernel's top): ctypes
converts each argument of a call one by one, and on the small rows of a transformer at batch
1 that conversion cost more than the kernel. Arrays never overlap (the
builder's noalias contract): a kernel that may work in place has a separate source array and a
``from_x`` flag (0: the output already holds the input; the source is then a dummy).

- ``layer_norm``: ``y = (s - mean(s)) / sqrt(var(s) + eps) * gamma + beta`` per row, where
  ``s = x + skip + bias`` (skip and bias optional; ``skip`` has ``skip_rows`` rows, repeated:
  a (S, n) skip for a (B, S, n) input, or one row); ``simplified``: the RMS form
  ``s / sqrt(mean(s^2) + eps) * gamma`` (no centring, no beta); ``write_sum``: ``s`` is also
  written to ``ysum`` (SkipLayerNormalization's fourth output). Two passes for the statistics
  (mean, then the centred sum of squares), as the numpy path, so a large common offset does
  not cancel the variance; the statistics and the normalised value are computed in float64,
  so rows of magnitude 1e20 (whose squares overflow float32) still normalise.
- ``softmax``: ``y = softmax(t)`` per row with ``t = x * scale`` (or ``/ scale``, or neither),
  plus an additive mask ``madd`` and then ``fill`` where a uint8 mask ``mfill`` is non-zero:
  attention's scale + mask + softmax in one pass over the scores. The masks are broadcast by
  element strides over the row's (a, b, c) coordinates (the output seen as (A, Bd, C, n)) and
  the column (stride 0 or 1). A row whose maximum is -inf or that holds NaN/+inf gives NaN, as
  numpy's ``exp(t - max) / sum``; with ``zero_empty`` a row of only -inf gives zeros.
- ``gelu``: ``y = act(x + b) + z`` with act 0 none, 1 GELU (erf form), 2 GELU (tanh
  approximation), 3 ReLU; ``b`` one row (bias), ``z`` of y's shape (a residual).
- ``gelu_grad``: the erf GELU's gradient ``g * (Phi(x) + x phi(x))`` over flat elements
  (the training step's fused GELU chain, ``workbench.autodiff.fusion``).
- ``erf_f32``: the Erf op's ``y = erf(x)`` (float32) over the flat elements
  ``r0 <= i < r1``, computed in float64 with exactly the operations, in the same order, of the
  numpy path ``workbench.ops.elementwise._erf_f64`` (so both give the same bits): |x| < 2
  as x times a Chebyshev series in x*x for every value of a chunk of 256, then the rest
  (1 - exp(-y*y) times a Chebyshev series in y, with the exp written out) gathered into the
  caller's scratch rows ``xl`` / ``il`` (256 float64 each: values, indices) and computed
  there; each series summed by Clenshaw's recurrence over constants
  (``kernels/_erf_series.py``) so the loops vectorise. (A float64 twin measured no faster
  than the numpy path, 3.9 vs 3.1-4.2 ms for 65,536 values: float64 stays on numpy.)

``exp`` and ``erf`` are evaluated here (not by libm calls) so that the loops vectorise: exp by
range reduction to ``2^k * p(r)``, ``|r| <= ln2 / 2``, with a degree-7 Taylor polynomial
(relative error below 2 ulp); erf by the engine's fitted rational function (the same constants
as ``workbench.ops.linalg._erf_f32``, 3.8e-7 max error).
"""

import numpy as np
from llvmlite import ir as llir
from numba import carray, njit, types
from numba.extending import intrinsic

from workbench.compiled.build import export
from workbench.compiled.kernels import _erf_series as _erfs

_FM = ("contract", "reassoc", "nsz", "arcp")

F = np.float32
_ZERO, _ONE, _HALF = F(0.0), F(1.0), F(0.5)
_LOG2E = F(1.4426950408889634)
_LN2_HI, _LN2_LO = F(0.693359375), F(-2.12194440e-4)
_EXP_HI, _EXP_LO = F(88.72), F(-103.98)   # below exp(-103.98) even a subnormal rounds to 0
_SUB_K, _SUB_SCALE = np.int32(-126), F(2.0 ** -64)   # 2**k for k < -126: 2**(k + 64) * 2**-64
_INF = F(np.inf)
_C2, _C3, _C4, _C5, _C6, _C7 = (F(1 / 2), F(1 / 6), F(1 / 24), F(1 / 120), F(1 / 720),
                                F(1 / 5040))
_INV_SQRT2 = F(0.7071067811865476)
_TANH_C = F(0.7978845608028654)      # sqrt(2 / pi)
_TANH_K = F(0.044715)
_ERF_CLIP = F(3.92)
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = (F(1.1283791693956282), F(0.18509064252532423),
                                     F(0.054274654535022344), F(0.003841616395394747),
                                     F(0.00037832482008210284), F(4.651756233475595e-06),
                                     F(-1.3015525557788096e-08))
_Q0, _Q1, _Q2, _Q3, _Q4 = (F(0.4973657248727226), F(0.11388771287004174),
                           F(0.015441401574945961), F(0.0013042510080971189),
                           F(6.280339323636985e-05))


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llir.FloatType())
    return sig, codegen


@njit(inline="always", fastmath=_FM)
def _exp(x):
    xc = x
    if xc > _EXP_HI:
        xc = _EXP_HI
    if xc < _EXP_LO:
        xc = _EXP_LO
    k = np.floor(xc * _LOG2E + _HALF)
    r = xc - k * _LN2_HI - k * _LN2_LO
    p = _ONE + r * (_ONE + r * (_C2 + r * (_C3 + r * (_C4 + r * (_C5 + r * (_C6 + r * _C7))))))
    ki = np.int32(k)
    # results below float32's smallest normal (k < -126) are subnormal: scale in two steps
    # (no flush to zero, as numpy's exp), both picked without a branch so the loop vectorises
    sub = ki < _SUB_K
    kb = ki + np.int32(64) if sub else ki
    sc = _SUB_SCALE if sub else _ONE
    e = (p * _f32_from_bits(np.int32((kb + np.int32(127)) << np.int32(23)))) * sc
    if x > _EXP_HI:
        e = _INF
    if x < _EXP_LO:
        e = _ZERO
    if x != x:
        e = x
    return e


@njit(inline="always", fastmath=_FM)
def _erf(x):
    c = x
    if c > _ERF_CLIP:
        c = _ERF_CLIP
    if c < -_ERF_CLIP:
        c = -_ERF_CLIP
    s = c * c
    p = _P0 + s * (_P1 + s * (_P2 + s * (_P3 + s * (_P4 + s * (_P5 + s * _P6)))))
    q = _ONE + s * (_Q0 + s * (_Q1 + s * (_Q2 + s * (_Q3 + s * _Q4))))
    return c * p / q


# ------------------------------------------------------------------------------ LayerNorm
@export("layer_norm", "f32[] f32[] f32[] f32[] f32[] f32[]! f32[]! i64[] i64 i64 f32",
        fastmath=_FM)
def layer_norm(xp, skipp, biasp, gammap, betap, yp, sump, pp, r0, r1, eps):
    P = carray(pp, (8,))
    rows, n, skip_rows, has_skip = P[0], P[1], P[2], P[3]
    has_bias, has_beta, simplified, write_sum = P[4], P[5], P[6], P[7]
    x = carray(xp, (rows, n))
    y = carray(yp, (rows, n))
    g = carray(gammap, (n,))
    skip = carray(skipp, (skip_rows, n)) if has_skip else carray(skipp, (1, 1))
    bias = carray(biasp, (n,)) if has_bias else carray(biasp, (1,))
    beta = carray(betap, (n,)) if has_beta else carray(betap, (1,))
    ysum = carray(sump, (rows, n)) if write_sum else carray(sump, (1, 1))
    for r in range(r0, r1):
        src = x[r]
        if has_skip or has_bias:
            dst = ysum[r] if write_sum else y[r]
            if has_skip:
                sk = skip[r % skip_rows]
                for j in range(n):
                    dst[j] = src[j] + sk[j]
                if has_bias:
                    for j in range(n):
                        dst[j] += bias[j]
            else:
                for j in range(n):
                    dst[j] = src[j] + bias[j]
            src = dst
        out = y[r]
        if simplified:
            ss = 0.0
            for j in range(n):
                v = np.float64(src[j])
                ss += v * v
            inv = 1.0 / np.sqrt(ss / n + np.float64(eps))
            for j in range(n):
                out[j] = F(src[j] * inv) * g[j]
            continue
        m = 0.0
        for j in range(n):
            m += np.float64(src[j])
        m = m / n
        ss = 0.0
        for j in range(n):
            d = np.float64(src[j]) - m
            ss += d * d
        inv = 1.0 / np.sqrt(ss / n + np.float64(eps))
        if has_beta:
            for j in range(n):
                out[j] = F((src[j] - m) * inv) * g[j] + beta[j]
        else:
            for j in range(n):
                out[j] = F((src[j] - m) * inv) * g[j]


# ------------------------------------------------------------------------------ softmax
@export("softmax", "f32[] f32[]! f32[] u8[] i64[] i64 i64 f32 f32", fastmath=_FM)
def softmax(xp, yp, maddp, mfillp, pp, r0, r1, scale, fill):
    P = carray(pp, (19,))
    rows, n, C, Bd = P[0], P[1], P[2], P[3]
    sa, sb, sc, st, fa, fb, fc, ft = P[4], P[5], P[6], P[7], P[8], P[9], P[10], P[11]
    madd_size, mfill_size, from_x, scale_mode = P[12], P[13], P[14], P[15]
    has_add, has_fill, zero_empty = P[16], P[17], P[18]
    x = carray(xp, (rows, n)) if from_x else carray(xp, (1, 1))
    y = carray(yp, (rows, n))
    madd = carray(maddp, (madd_size,))
    mfill = carray(mfillp, (mfill_size,))
    # the row's coordinates (a, b, c) in the (A, Bd, C) grid, stepped along (no divisions)
    c = r0 % C
    b = (r0 // C) % Bd
    a = r0 // (C * Bd)
    for r in range(r0, r1):
        if r > r0:
            c += 1
            if c == C:
                c = 0
                b += 1
                if b == Bd:
                    b = 0
                    a += 1
        out = y[r]
        if from_x:
            src = x[r]
            if scale_mode == 1:
                for j in range(n):
                    out[j] = src[j] * scale
            elif scale_mode == 2:
                for j in range(n):
                    out[j] = src[j] / scale
            else:
                for j in range(n):
                    out[j] = src[j]
        elif scale_mode == 1:
            for j in range(n):
                out[j] *= scale
        elif scale_mode == 2:
            for j in range(n):
                out[j] /= scale
        if has_add or has_fill:
            if has_add:
                o = a * sa + b * sb + c * sc
                if st:
                    for j in range(n):
                        out[j] += madd[o + j]
                else:
                    v = madd[o]
                    for j in range(n):
                        out[j] += v
            if has_fill:
                o = a * fa + b * fb + c * fc
                if ft:
                    for j in range(n):
                        if mfill[o + j]:
                            out[j] = fill
                elif mfill[o]:
                    for j in range(n):
                        out[j] = fill
        m = -_INF
        for j in range(n):
            v = out[j]
            m = v if v > m else m
        if zero_empty and m == -_INF:
            nan = False
            for j in range(n):
                if out[j] != out[j]:
                    nan = True
            if not nan:     # every entry -inf: nothing to attend to, zeros
                for j in range(n):
                    out[j] = _ZERO
                continue
        s = _ZERO
        for j in range(n):
            e = _exp(out[j] - m)
            out[j] = e
            s += e
        inv = _ONE / s
        for j in range(n):
            out[j] *= inv


# ------------------------------------------------------------------------------ GELU
@export("gelu", "f32[] f32[]! f32[] f32[] i64[] i64 i64", fastmath=_FM)
def gelu(xp, yp, bp, zp, pp, r0, r1):
    P = carray(pp, (6,))
    rows, n, from_x, has_b, has_z, act = P[0], P[1], P[2], P[3], P[4], P[5]
    x = carray(xp, (rows, n)) if from_x else carray(xp, (1, 1))
    y = carray(yp, (rows, n))
    b = carray(bp, (n,)) if has_b else carray(bp, (1,))
    z = carray(zp, (rows, n)) if has_z else carray(zp, (1, 1))
    for r in range(r0, r1):
        out = y[r]
        if from_x:
            src = x[r]
            for j in range(n):
                out[j] = src[j]
        if has_b:
            for j in range(n):
                out[j] += b[j]
        if act == 1:
            for j in range(n):
                v = out[j]
                out[j] = v * (_ONE + _erf(v * _INV_SQRT2)) * _HALF
        elif act == 2:
            for j in range(n):
                v = out[j]
                out[j] = v / (_ONE + _exp(F(-2.0) * _TANH_C * (v + _TANH_K * v * v * v)))
        elif act == 3:
            for j in range(n):
                v = out[j]
                out[j] = v if v > _ZERO or v != v else _ZERO
        if has_z:
            zr = z[r]
            for j in range(n):
                out[j] += zr[j]


# ------------------------------------------------------------------------------ Erf
def _erf_kernel(terms_small, terms_large):
    """erf of one float64 value in two parts: ``small(v)`` for |v| < 2 and ``large(v)`` for
    the rest (not NaN), with the series' leading terms (constants, so the loops vectorise);
    the operations and their order are those of ``elementwise._erf_f64``."""
    s_rev, s0 = tuple(_erfs.SMALL[1:terms_small][::-1]), _erfs.SMALL[0]
    l_rev, l0 = tuple(_erfs.LARGE[1:terms_large][::-1]), _erfs.LARGE[0]
    t_rev, t0 = tuple(_erfs.EXP_TAYLOR[1:12][::-1]), _erfs.EXP_TAYLOR[0]
    t12, log2e, ln2_hi, ln2_lo = _erfs.EXP_TAYLOR[12], _erfs.LOG2E, _erfs.LN2_HI, _erfs.LN2_LO

    @njit(inline="always")
    def small(v):
        u = v * v * 0.5 - 1.0
        u2 = u * 2.0
        b1 = 0.0
        b2 = 0.0
        for ck in s_rev:
            t = u2 * b1 - b2 + ck
            b2 = b1
            b1 = t
        return v * (u * b1 - b2 + s0)

    @njit(inline="always")
    def large(v):
        a = abs(v)
        y = a if a < 6.0 else 6.0
        t = -(y * y)
        kf = np.floor(t * log2e + 0.5)
        r = t - kf * ln2_hi
        r = r - kf * ln2_lo
        p = r * t12
        for c in t_rev:
            p = (p + c) * r
        p = p + t0
        e = p * _f64_from_bits((np.int64(kf) + np.int64(1023)) << np.int64(52))
        u = y * 0.5 - 2.0
        u2 = u * 2.0
        b1 = 0.0
        b2 = 0.0
        for ck in l_rev:
            tt = u2 * b1 - b2 + ck
            b2 = b1
            b1 = tt
        om = 1.0 - e * (u * b1 - b2 + l0)
        return om if v > 0 else -om

    @njit(inline="always")
    def run(x, y, xl, il, r0, r1):
        # per chunk of _ECH values: the |x| < 2 form for every value (vectorised), then the
        # others (and NaN) gathered into ``xl`` (their indices into ``il``), computed there
        # (vectorised) and scattered back
        for c0 in range(r0, r1, _ECH):
            c1 = min(c0 + _ECH, r1)
            for i in range(c0, c1):
                y[i] = small(np.float64(x[i]))
            m = 0
            for i in range(c0, c1):
                v = np.float64(x[i])
                if not abs(v) < 2.0:
                    xl[m] = v
                    il[m] = i
                    m += 1
            for j in range(m):
                v = xl[j]
                xl[j] = v if v != v else large(v)
            for j in range(m):
                y[np.int64(il[j])] = xl[j]
    return run


_ECH = 256


@intrinsic
def _f64_from_bits(typingctx, bits):
    """The float64 whose bit pattern is the int64 ``bits``."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llir.DoubleType())
    return sig, codegen


_INV_SQRT_2PI = F(0.3989422804014327)


@export("gelu_grad", "f32[] f32[] f32[]! i64 i64", fastmath=_FM)
def gelu_grad(xp, gp, dp, r0, r1):
    """The erf GELU's gradient over the flat elements ``r0 <= i < r1``:
    ``dx = g * (Phi(x) + x * phi(x))``, Phi(x) = (1 + erf(x / sqrt 2)) / 2 by this module's
    fitted erf, phi(x) = exp(-x^2 / 2) / sqrt(2 pi) by its exp (a training step's fused
    Div/Erf/Add/Mul/Mul chain, ``workbench.autodiff.fusion``). +-Inf gives NaN, as the
    chain's own rules do (x * phi(x) is Inf * 0 there). The loop runs over slices from 0:
    LLVM vectorises it so (8 lanes), not a loop over ``range(r0, r1)`` (measured 7-8x slower
    at 65,536 values; the same bits)."""
    x = carray(xp, (r1,))[r0:]
    g = carray(gp, (r1,))[r0:]
    d = carray(dp, (r1,))[r0:]
    for i in range(r1 - r0):
        v = x[i]
        cdf = _HALF * (_ONE + _erf(v * _INV_SQRT2))
        d[i] = g[i] * (cdf + v * _exp(F(-0.5) * v * v) * _INV_SQRT_2PI)


_erf_run_f32 = _erf_kernel(*_erfs.TERMS_F32)


@export("erf_f32", "f32[] f32[]! f64[]! f64[]! i64 i64", fastmath=())
def erf_f32(xp, yp, xlp, ilp, r0, r1):
    _erf_run_f32(carray(xp, (r1,)), carray(yp, (r1,)), carray(xlp, (_ECH,)), carray(ilp, (_ECH,)),
                  r0, r1)
