"""Linear algebra: MatMul, Gemm, MatMulInteger, Einsum, Det.

Products run on BLAS through ``matmul`` (float16/bfloat16 are computed in float32 and cast
back; transposed operands are passed as views, never copied). Einsum validates and normalizes
its equation (explicit output, spaces removed) before handing it to ``einsum``.
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np  # host-side shape checks only

from workbench import compiled
from workbench.arrays import xp_of
from workbench.compiled.kernels.attention_avx2 import ROWS as _ATT_ROWS
from workbench.compiled.kernels.attention_avx2 import work_floats as attention_work_floats
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc
from workbench.ops import rowwise
from workbench.ops._common import _UNCHECKED_BYTES, check_matmul, compute_dtype, ensure_array
from workbench.ops._common import softmax as softmax_core
from workbench.ops._integer import (
    IntegerArithmetic,
    arithmetic_of,
    saturated_product,
    saturates,
)
from workbench.ops.activation import softmax
from workbench.ops.elementwise import erf_array
from workbench.ops.norm import layer_norm as _layer_norm_op
from workbench.ops.parallel import (
    _PARALLEL_GEMM_MIN,
    Pieces,
    exact_matmul,
    exact_products_active,
    n_workers,
    parallel_matmul,
    pieces_entry,
    row_cuts,
    run_blocks,
)
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.shape import reshape, transpose


def _matmul(op, a, b):
    if type(a) is np.ndarray and type(b) is np.ndarray and a.ndim >= 2 and b.ndim >= 2 \
            and a.shape[-1] == b.shape[-2] and a.shape[-1] > 0:
        # small host products (the per-token layers of a transformer at batch 1) are one BLAS
        # call whatever the threads (parallel_matmul's own rule): skip its bookkeeping. The
        # bound on the output (every batch entry of one operand against every one of the
        # other; the output itself when both have the same batch dimensions, as attention's
        # stacked products: 45-53 -> 29-35 us at 8x4x32x16) keeps the memory check's rule:
        # only outputs that need no check come here
        k = a.shape[-1]
        if a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]:
            out_bound = (a.size // k) * b.shape[-1]   # equal batch dims: the output's size
        else:
            out_bound = (a.size // k) * (b.size // k)
        if out_bound * k < _PARALLEL_GEMM_MIN and \
                out_bound * max(a.dtype.itemsize, b.dtype.itemsize, 4) <= _UNCHECKED_BYTES:
            try:
                if a.ndim >= 3 and b.ndim == 2 and a.flags.c_contiguous:
                    y = np.matmul(a.reshape(-1, k), b)
                    return y.reshape(a.shape[:-1] + (b.shape[1],))
                return np.matmul(a, b)
            except ValueError as e:
                raise ShapeError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                                 f"broadcast over their batch dimensions ({e})") from None
    xp = xp_of(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{op}: inputs must have rank >= 1, got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise ShapeError(f"{op}: inner dimensions differ: A {tuple(a.shape)} has {ka} columns, "
                         f"B {tuple(b.shape)} has {kb} rows")
    check_matmul(op, a.shape, b.shape, max(a.dtype.itemsize, 4))
    # a training step's products (ops.parallel.exact_products) round alike at any thread count
    mm = exact_matmul if exact_products_active() else parallel_matmul
    try:
        if a.ndim >= 3 and b.ndim == 2 and a.flags.c_contiguous:
            # (..., M, K) @ (K, N): one GEMM over every row, not a batch of small ones
            y = mm(xp, a.reshape(-1, ka), b)
            return y.reshape(tuple(a.shape[:-1]) + (b.shape[1],))
        if a.ndim >= 2 and b.ndim >= 2:
            return mm(xp, a, b)
        return xp.matmul(a, b)
    except ValueError as e:
        raise ShapeError(f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast "
                         f"over their batch dimensions ({e})") from None


@kernel("MatMul", since=1, category="layer", wants_ctx=True)
def matmul(A, B, ctx=None):
    """numpy.matmul semantics (N-D batch broadcasting, 1-D operands promoted and squeezed).
    In an inference plan (``ctx`` given, not training) a float32 ``(..., K) @ (K, N)`` runs
    in the compiled ``gemm_avx2`` kernel when it is loaded (:func:`_c_gemm`), like
    FusedMatMul: a graph with its epilogue fused and the same graph unfused compute the same
    product."""
    if ctx is not None and not ctx.training:
        y = _bound_step(ctx, A, B, None, None, None, None)
        if y is not None:
            return y
        y = _c_gemm(A, B, None, None, ctx)
        if y is not None:
            _bind_step(ctx, A, B, None, None, None, None, "", 0.0, False, False, y.shape)
            return y
    if A.dtype.itemsize >= 4 and B.dtype.itemsize >= 4:   # nothing narrower to widen
        return _matmul("MatMul", A, B)
    cda, cdb = compute_dtype(A.dtype), compute_dtype(B.dtype)
    if cda != A.dtype or cdb != B.dtype:  # float16/bfloat16: BLAS in float32
        return _matmul("MatMul", A.astype(cda), B.astype(cdb)).astype(A.dtype, copy=False)
    return _matmul("MatMul", A, B)


@kernel("Gemm", since=1, category="layer", wants_ctx=True)
def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0, ctx=None):
    """Y = alpha * A' @ B' + beta * C with C unidirectionally broadcast to (M, N). In an
    inference plan (``ctx`` given, not training) a float32 ``A @ B' + C`` (alpha 1, beta 1
    or no C, transA 0, C None or an (N,) row: a Linear layer, BERT's pooler and classifier)
    runs in the compiled ``gemm_avx2`` kernel when it is loaded, as MatMul does
    (:func:`_c_gemm`) — except one row against a large weight (a CNN's classifier at batch
    1: a memory-bound product, no faster packed, and the packed copy costs memory)."""
    if ctx is not None and not ctx.training and alpha == 1.0 and not transA \
            and (C is None or beta == 1.0):
        y = _bound_step(ctx, A, B, C, None, None, None)
        if y is not None:
            return y
        if type(A) is np.ndarray and A.ndim == 2 and (C is None or C.ndim == 1) \
                and (A.shape[0] > 1 or B.size <= _GEMV_PACKED_MAX):
            y = _c_gemm(A, B, C, None, ctx, trans_b=bool(transB))
            if y is not None:
                _bind_step(ctx, A, B, C, None, None, None, "", 0.0, False, bool(transB),
                           y.shape)
                return y
    op = "Gemm"
    xp = xp_of(A, B)
    if A.ndim != 2 or B.ndim != 2:
        raise ShapeError(f"{op}: A and B must be 2-D, got {tuple(A.shape)} and "
                         f"{tuple(B.shape)}")
    out_dt = A.dtype
    cd = compute_dtype(out_dt)
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"{op}: A' {tuple(a.shape)} and B' {tuple(b.shape)} (after transA="
                         f"{transA}, transB={transB}) have different inner dimensions")
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if xp is np and a.dtype == cd and b.dtype == cd and m * n * k < _PARALLEL_GEMM_MIN \
            and m * n * 8 <= _UNCHECKED_BYTES:
        y = np.matmul(a, b)    # a small product: one BLAS call (parallel_matmul's own rule)
    else:
        check_matmul(op, a.shape, b.shape, 8)
        mm = exact_matmul if exact_products_active() else parallel_matmul
        y = mm(xp, a.astype(cd, copy=False), b.astype(cd, copy=False))
    integer = cd.kind in "iu"
    if alpha != 1.0:
        y = (y * alpha).astype(cd) if integer else y * cd.type(alpha)
    if C is not None and beta != 0.0:
        M, N = y.shape
        if C.ndim > 2 or any(c not in (1, n) for c, n in zip(C.shape[::-1], (N, M))):
            raise ShapeError(f"{op}: C of shape {tuple(C.shape)} does not broadcast to the "
                             f"output shape ({M}, {N})")
        c = C.astype(cd, copy=False)
        if beta == 1.0:
            y += c
        elif integer:
            y = (y + c * beta).astype(cd)
        else:
            y += c * cd.type(beta)
    return y.astype(out_dt, copy=False)


def _zero_point_rows(op, zp, a):
    """A's zero point shaped to broadcast over A: scalar, per row (M,) or (..., M, 1)."""
    if zp is None:
        return 0
    z = zp.astype(xp_of(zp).float64)
    if z.size == 1:
        return z.reshape(())
    if z.ndim == 1 and a.ndim >= 2 and z.shape[0] == a.shape[-2]:
        return z.reshape(-1, 1)
    if z.ndim == a.ndim:
        return z
    raise ShapeError(f"{op}: a_zero_point of shape {tuple(zp.shape)} does not match A "
                     f"{tuple(a.shape)} (scalar, one per row, or A's rank with last dim 1)")


@kernel("MatMulInteger", since=10, category="layer")
def matmul_integer(A, B, a_zero_point=None, b_zero_point=None, *,
                   integer_arithmetic=IntegerArithmetic.EXACT):
    """(A - a_zp) @ (B - b_zp) with exact integer accumulation, int32 output (or uint8 x int8
    pairs saturated to int16, ``integer_arithmetic=SATURATING_U8S8``: see ops/_integer.py)."""
    op = "MatMulInteger"
    xp = xp_of(A, B)
    if saturates(arithmetic_of(op, integer_arithmetic), A.dtype, B.dtype):
        check_matmul(op, A.shape, B.shape)
        az = None if a_zero_point is None else _zero_point_rows(op, a_zero_point, A)
        bz = None if b_zero_point is None else b_zero_point.reshape(-1)
        acc = saturated_product(op, A, az, B, bz if bz is None or bz.size > 1 else bz[0])
        return acc.astype(xp.int32)
    # float64 holds every partial sum exactly (|term| < 2**16) and runs on BLAS
    a = A.astype(xp.float64) - _zero_point_rows(op, a_zero_point, A)
    b = B.astype(xp.float64)
    if b_zero_point is not None:
        bz = b_zero_point.astype(xp.float64)
        b = b - (bz.reshape(()) if bz.size == 1 else bz)
    return xp.rint(_matmul(op, a, b)).astype(xp.int32)


# --------------------------------------------------------------------------------------------
# Einsum
# --------------------------------------------------------------------------------------------

def _parse_term(op, term, ndim, index):
    """Letters of one input term, with '...' expanded to its number of dimensions."""
    if term.count("...") > 1 or term.replace("...", "").count(".") != 0:
        raise InputError(f"{op}: term {term!r} may contain at most one '...' ellipsis")
    letters = term.replace("...", "")
    bad = [c for c in letters if not c.isascii() or not c.isalpha()]
    if bad:
        raise InputError(f"{op}: term {term!r} contains {bad[0]!r}; only letters a-z, A-Z "
                         f"and '...' are allowed")
    if "..." in term:
        n_ell = ndim - len(letters)
        if n_ell < 0:
            raise ShapeError(f"{op}: term {term!r} names {len(letters)} dimensions but input "
                             f"{index} has rank {ndim}")
    else:
        n_ell = 0
        if len(letters) != ndim:
            raise ShapeError(f"{op}: term {term!r} names {len(letters)} dimensions but input "
                             f"{index} has rank {ndim}")
    return letters, n_ell


def normalize_einsum(equation, shapes):
    """The explicit, space-free form of an einsum equation, validated against ``shapes``."""
    op = "Einsum"
    if not isinstance(equation, str) or not equation.strip():
        raise InputError(f"{op}: attribute equation is required")
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise InputError(f"{op}: equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise InputError(f"{op}: equation {equation!r} has {len(terms)} input terms but "
                         f"{len(shapes)} inputs were given")
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    max_ell = 0
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        letters, n_ell = _parse_term(op, term, len(shape), i)
        max_ell = max(max_ell, n_ell)
        pos = term.find("...")
        dims = list(shape)
        if pos >= 0:
            dims = dims[:pos] + dims[pos + n_ell:]
        for c, d in zip(letters, dims):
            counts[c] = counts.get(c, 0) + 1
            if c in sizes and sizes[c] != d and 1 not in (sizes[c], d):
                raise ShapeError(f"{op}: index {c!r} has size {sizes[c]} in one place and {d} "
                                 f"in input {i} (equation {equation!r}, shapes "
                                 f"{[tuple(s) for s in shapes]})")
            sizes[c] = max(sizes.get(c, d), d)
    has_ell = any("..." in t for t in terms)
    if arrow:
        out_letters = rhs.replace("...", "")
        if rhs.count("...") > 1 or rhs.replace("...", "").count("."):
            raise InputError(f"{op}: the output term {rhs!r} may contain at most one '...'")
        for c in out_letters:
            if c not in sizes:
                raise InputError(f"{op}: output index {c!r} does not appear in any input term "
                                 f"of {equation!r}")
        if len(set(out_letters)) != len(out_letters):
            raise InputError(f"{op}: output term {rhs!r} repeats an index")
        if "..." in rhs and not has_ell:
            rhs = rhs.replace("...", "")
        elif has_ell and max_ell > 0 and "..." not in rhs:
            raise InputError(f"{op}: the inputs use '...' for {max_ell} dimension(s) but the "
                             f"output term {rhs!r} has no '...'")
    else:
        singles = sorted(c for c, n in counts.items() if n == 1)  # ASCII: 'A' < 'Z' < 'a'
        rhs = ("..." if has_ell else "") + "".join(singles)
    return f"{','.join(terms)}->{rhs}"


def _einsum_out_shape(eq: str, shapes) -> list:
    """Output shape of a normalised (explicit) equation: its letters' sizes, and the broadcast
    of the operands' '...' dims."""
    lhs, _, rhs = eq.partition("->")
    sizes: dict = {}
    ell: list = []
    for term, shape in zip(lhs.split(","), shapes):
        pos = term.find("...")
        letters = term.replace("...", "")
        dims = list(shape)
        if pos >= 0:
            n_ell = len(dims) - len(letters)
            e = dims[pos:pos + n_ell]
            dims = dims[:pos] + dims[pos + n_ell:]
            if len(e) > len(ell):
                ell = [1] * (len(e) - len(ell)) + ell
            for k in range(1, len(e) + 1):
                ell[-k] = max(ell[-k], e[-k])
        for c, d in zip(letters, dims):
            sizes[c] = max(sizes.get(c, 1), int(d))
    out = [sizes.get(c, 1) for c in rhs.replace("...", "")]
    return (ell + out) if "..." in rhs else out


@kernel("Einsum", since=12, category="layer")
def einsum(*Inputs, equation=None):
    """Einstein summation (explicit and implicit forms, '...' broadcasting) on ``einsum``."""
    if not Inputs:
        raise InputError("Einsum: at least one input is required")
    xp = xp_of(*Inputs)
    eq = normalize_einsum(equation, [x.shape for x in Inputs])
    check_alloc(_einsum_out_shape(eq, [x.shape for x in Inputs]), compute_dtype(Inputs[0].dtype),
                what="Einsum: the output")
    out_dt = Inputs[0].dtype
    cd = compute_dtype(out_dt)
    ops = [x.astype(cd, copy=False) for x in Inputs]
    y = xp.einsum(eq, *ops, optimize=len(ops) > 1)
    return xp.asarray(y).astype(out_dt, copy=False)


# --------------------------------------------------------------------------------------------
# Det
# --------------------------------------------------------------------------------------------

@kernel("Det", since=11)
def det(X):
    """Determinant of the trailing square matrices, shape X.shape[:-2]."""
    xp = xp_of(X)
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ShapeError(f"Det: input must have shape (..., M, M), got {tuple(X.shape)}")
    cd = compute_dtype(X.dtype)
    y = xp.linalg.det(X.astype(cd, copy=False))
    return xp.asarray(y).astype(X.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# FusedMatMul (internal: made by the inference pass workbench.graph.passes.fuse_matmul_epilogue)
# --------------------------------------------------------------------------------------------

#: activations the FusedMatMul epilogue applies (what fuse_matmul_epilogue may fuse)
MATMUL_EPILOGUES = ("", "Gelu", "GeluTanh", "Relu")


def _broadcasts_into(src, dst) -> bool:
    """Whether an operand of shape ``src`` broadcasts to exactly ``dst`` (an in-place update
    of a ``dst``-shaped array may read it)."""
    off = len(dst) - len(src)
    if off < 0:
        return False
    for i, d in enumerate(src):
        if d != 1 and d != dst[off + i]:
            return False
    return True


#: erf(x) / x ~ P(x^2) / Q(x^2) on |x| <= _ERF_CLIP (float32: erf is 1 beyond), fitted for
#: this engine (linearised least squares with Sanathanan-Koerner reweighting towards the
#: relative error, in float64, at 8,000 points); evaluated in float32 the largest error
#: against float64 erf over [-8, 8] is 3.8e-7 (tests/ops/test_small_fast_paths.py)
_ERF_CLIP = 3.92
_ERF_P = (1.1283791693956282,
          0.18509064252532423,
          0.054274654535022344,
          0.003841616395394747,
          0.00037832482008210284,
          4.651756233475595e-06,
          -1.3015525557788096e-08)
_ERF_Q = (0.4973657248727226,
          0.11388771287004174,
          0.015441401574945961,
          0.0013042510080971189,
          6.280339323636985e-05)


def _erf_f32(x, out=None):
    """erf of a float32 host array as a rational function: about 30 whole-array operations
    that vectorise, where scipy.special.erf computes float32 one element at a time in
    double precision (6.5x slower on a BERT-like batch-8 GELU, 65,536 values). Written into
    ``out`` (which may be ``x`` itself) with two temporaries of x's shape: on arrays above
    malloc's mmap threshold every fresh temporary costs page faults (five of them made the
    GELU 5x slower inside a model than alone)."""
    f32 = np.float32
    lo, hi = f32(-_ERF_CLIP), f32(_ERF_CLIP)
    s = np.clip(x, lo, hi)                     # temporary 1: x clipped, then squared
    np.multiply(s, s, out=s)
    p = np.multiply(s, f32(_ERF_P[-1]))        # temporary 2: P(s)
    p += f32(_ERF_P[-2])
    for c in _ERF_P[-3::-1]:
        p *= s
        p += f32(c)
    out = np.multiply(x, 1, out=out) if out is not x else out   # x itself stays readable
    np.clip(out, lo, hi, out=out)
    p *= out                                   # x P(s); ``out`` is free again
    np.multiply(s, f32(_ERF_Q[-1]), out=out)   # Q(s) in ``out``
    out += f32(_ERF_Q[-2])
    for c in _ERF_Q[-3::-1]:
        out *= s
        out += f32(c)
    out *= s
    out += f32(1.0)
    np.divide(p, out, out=out)
    return out


def _epilogue_inplace(y, activation):
    """GELU (erf or tanh form) or ReLU applied to the float array ``y`` in place."""
    xp = xp_of(y)
    if activation == "Relu":
        xp.maximum(y, 0, out=y)
        return
    t = y * y.dtype.type(1.0 / math.sqrt(2.0)) if activation == "Gelu" else y * y
    if activation == "Gelu":
        if type(t) is np.ndarray and t.dtype == np.float32:
            _erf_f32(t, out=t)
        else:
            t = erf_array(t)
    else:   # 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))
        t *= y.dtype.type(0.044715)
        t += 1
        t *= y
        t *= y.dtype.type(math.sqrt(2.0 / math.pi))
        xp.tanh(t, out=t)
    t += 1
    y *= t
    y *= y.dtype.type(0.5)


@kernel("FusedMatMul", since=1, domain=FUSED_DOMAIN, wants_ctx=True)
def fused_matmul_epilogue(A, B, bias=None, Z=None, gamma=None, beta=None, *, activation="",
                          epsilon=1e-5, skip_norm=0, ctx=None):
    """``activation(A @ B + bias) + Z`` in one node (MatMul -> Add(bias) -> GELU/ReLU ->
    Add(residual) as exported by PyTorch's Linear layers): the epilogue runs in place on the
    product's fresh output. ``activation`` is "" (none), "Gelu" (erf form), "GeluTanh" (the
    tanh approximation) or "Relu". With ``gamma`` the result is then normalised over its last
    axis (LayerNormalization with Scale ``gamma``, B ``beta``, ``epsilon``); ``skip_norm`` = 1:
    the node was ``SkipLayerNormalization(A @ B, Z, gamma, beta, bias)`` (com.microsoft), whose
    sum is ``(A @ B + Z) + bias``. Either way the result is bit for bit the unfused graph's
    (the same adds in the same order, the same LayerNorm kernel): a plan that does not fuse
    (the trainable one) gives the same numbers."""
    if activation not in MATMUL_EPILOGUES:
        raise InputError(f"FusedMatMul: unknown activation {activation!r} (known: "
                         f"{', '.join(repr(a) for a in MATMUL_EPILOGUES)})")
    if ctx is not None and not ctx.training:
        y = _bound_step(ctx, A, B, bias, Z, gamma, beta)
        if y is not None:
            return y
        y = _c_fused(A, B, bias, Z, gamma, beta, activation, epsilon, skip_norm, ctx)
        if y is not None:
            return y
    if type(A) is np.ndarray and type(B) is np.ndarray and A.dtype == _F32 \
            and B.dtype == _F32 and not skip_norm:
        y = _fused_f32(A, B, bias, Z, gamma, beta, activation, epsilon)
        if y is not None:
            return y
    xp = xp_of(A, B)
    y = ensure_array(matmul(A, B), xp)   # a fresh product: the epilogue writes into it
    if gamma is None:
        return _matmul_epilogue(y, bias, Z, activation, xp)
    if skip_norm:
        if activation or Z is None:
            raise InputError("FusedMatMul: skip_norm needs a skip input (Z) and no activation")
        from workbench.ops.contrib_transformer import skip_layer_norm_output
        return skip_layer_norm_output(y, Z, gamma, beta, bias, epsilon)
    return _layer_norm_op(_matmul_epilogue(y, bias, Z, activation, xp), gamma, beta,
                          epsilon=epsilon)


_F32 = np.dtype(np.float32)
_GELU_CODES = {"Gelu": rowwise.ACTIVATIONS["Gelu"], "GeluTanh": rowwise.ACTIVATIONS["GeluTanh"]}


def _row_f32(v, n) -> bool:
    """``v`` is a float32 C-contiguous host row of n values."""
    return type(v) is np.ndarray and v.dtype == _F32 and v.shape == (n,) \
        and v.flags.c_contiguous


def _fused_f32(A, B, bias, Z, gamma, beta, activation, epsilon):
    """FusedMatMul's usual float32 case with few checks: A (..., K) C-contiguous, B (K, N),
    a small product (one BLAS call, :func:`_matmul`'s rule), bias/gamma/beta (N,) rows, Z of
    the output's shape, activation none or GELU. The same calls as the general path (one
    ``matmul`` over A's rows, the numpy adds, the compiled GELU and LayerNorm kernels), so the
    same bits; None when the case is another (the general path then runs)."""
    if B.ndim != 2 or A.ndim < 2 or not A.flags.c_contiguous:
        return None
    k, n = B.shape
    if A.shape[-1] != k or k == 0:
        return None
    rows = A.size // k
    if rows * n * k >= _PARALLEL_GEMM_MIN or rows * n * 4 > _UNCHECKED_BYTES \
            or (bias is not None and not _row_f32(bias, n)):
        return None
    shape = A.shape[:-1] + (n,)
    if Z is not None and (type(Z) is not np.ndarray or Z.dtype != _F32 or Z.shape != shape
                          or not Z.flags.c_contiguous):
        return None
    if gamma is not None and (not _row_f32(gamma, n)
                              or (beta is not None and not _row_f32(beta, n))):
        return None
    if activation:
        act = _GELU_CODES.get(activation)
        if act is None:
            return None
        y = np.matmul(A.reshape(rows, k), B).reshape(shape)
        if not rowwise.gelu_rows_inplace(y, act, bias, Z):   # not compiled here: numpy's
            y = _matmul_epilogue(y, bias, Z, activation, np)
    else:
        y = np.matmul(A.reshape(rows, k), B).reshape(shape)
        if bias is not None:
            y += bias
        if Z is not None:
            y += Z
    if gamma is None:
        return y
    out = rowwise.layer_norm_rows(y, gamma, beta, epsilon)
    return _layer_norm_op(y, gamma, beta, epsilon=epsilon) if out is None else out


_GEMV_PACKED_MAX = 1 << 18   # weight elements above which a one-row Gemm stays on BLAS
_GEMM_PACK = "gemm_avx2_matmul_pack"   # node-context key of the packed weights
_PACK_SAMPLES = 16   # weight elements compared to tell an updated weight from the packed one
_GEMM_TILE = 6       # rows of gemm_avx2's register tile (row ranges split on whole tiles)
_NEG_INF, _POS_INF = float("-inf"), float("inf")   # the kernel's clip bounds: no clip


def _packed_weights(ctx, B, bias, trans_b=False):
    """``B`` (K, N) (``trans_b``: B is (N, K), Gemm's transB=1) and ``bias`` packed for
    ``gemm_avx2.gemm``, made on the node's first
    compiled run and kept in its context (which lives with the plan); made again when B or
    the bias is another array (a weight the user assigned, a trainable plan's computed
    weight) or was changed in place (:data:`_PACK_SAMPLES` elements of B spread over it, or
    any bias element, differ)."""
    got = ctx.extra.get(_GEMM_PACK)
    if got is not None and got[0] is B and got[1] is bias \
            and B.reshape(-1)[got[2]].tobytes() == got[3] \
            and (bias is None or bias.tobytes() == got[4]):
        return got[5]
    from workbench.ops.conv_nhwc import pack_panels
    packed = pack_panels(B.T if trans_b else B, bias)
    idx = np.linspace(0, B.size - 1, min(_PACK_SAMPLES, B.size)).astype(np.intp)
    ctx.extra[_GEMM_PACK] = (B, bias, idx, B.reshape(-1)[idx].tobytes(),
                             None if bias is None else bias.tobytes(), packed)
    return packed


def _c_gemm(A, B, bias, Z, ctx, trans_b=False):
    """``A @ B + bias + Z`` (those adds in that order, float32 each) by the compiled
    ``gemm_avx2.gemm`` kernel: A (..., K) float32 C-contiguous, B (K, N) float32 (``trans_b``:
    B is (N, K) and ``A @ B.T`` is computed), bias None or
    an (N,) row, Z None or a C-contiguous array of the output's shape. Each output element is
    one accumulation over the whole K in the same order whatever the rows' split, so every
    plan and thread count gets the same bits. From :data:`_GEMM_PIECES_MIN` multiply-adds at
    2+ threads the rows are cut into pieces run by the C block pool (``blas_worker.par``)
    (:func:`_gemm_pieces`), else (those not loaded) from ``_PARALLEL_GEMM_MIN`` over the
    Python pool. None when the case is another or the kernel is
    not loaded (no C compiler, a CPU without AVX2+FMA, ``compiled.disabled()``): the caller's
    numpy/BLAS path runs."""
    if type(A) is not np.ndarray or type(B) is not np.ndarray or A.dtype != _F32 \
            or B.dtype != _F32 or B.ndim != 2 or A.ndim < 2 or not A.flags.c_contiguous:
        return None
    n, k = B.shape if trans_b else B.shape[::-1]
    if A.shape[-1] != k or k == 0 or n == 0 or A.size == 0 \
            or (bias is not None and not _row_f32(bias, n)):
        return None
    shape = A.shape[:-1] + (n,)
    if Z is not None and (type(Z) is not np.ndarray or Z.dtype != _F32 or Z.shape != shape
                          or not Z.flags.c_contiguous):
        return None
    kern = compiled.kernel("gemm_avx2.gemm")
    if kern is None:
        return None
    rows = A.size // k
    if rows * n * 4 > _UNCHECKED_BYTES:
        check_matmul("MatMul", (rows, k), (k, n), 4)
    wp, bp = _packed_weights(ctx, B, bias, trans_b)
    y = np.empty(shape, _F32)
    dp = compiled.data_pointer
    args = (dp(A), dp(wp), dp(bp), dp(A if Z is None else Z), dp(y), k, n)
    raw, has_z = kern.raw, int(Z is not None)
    macs = rows * n * k
    if macs < _GEMM_PIECES_MIN or rows <= _GEMM_TILE:
        raw(*args, 0, rows, has_z, _NEG_INF, _POS_INF)
        return y
    nw = n_workers()
    if nw == 1:
        raw(*args, 0, rows, has_z, _NEG_INF, _POS_INF)
        return y
    pieces = _gemm_pieces(args, rows, has_z, nw)
    if pieces is not None:
        pieces.run()
        return y
    if macs < _PARALLEL_GEMM_MIN:
        raw(*args, 0, rows, has_z, _NEG_INF, _POS_INF)
        return y
    step = max(_GEMM_TILE, -(-rows // (4 * nw) // _GEMM_TILE) * _GEMM_TILE)

    def work(chunk):
        for r0, r1 in chunk:
            raw(*args, r0, r1, has_z, _NEG_INF, _POS_INF)
    run_blocks(np, [(r, min(rows, r + step)) for r in range(0, rows, step)], work,
               rows * n * k)
    return y


#: multiply-adds from which a C GEMM (with its epilogue) is cut into row pieces over the C
#: worker threads (:class:`workbench.ops.parallel.Pieces`) at 2+ engine threads. Measured on
#: the 2-core AMD EPYC (AVX2, Zen 3), one process, pieces vs one call: see benchmarks/README.md
#: ("Wave 3 session 9: transformer inference on two threads")
_GEMM_PIECES_MIN = 1 << 20
#: pieces per engine thread (the caller and the workers claim them in turn)
_GEMM_PIECES_PER_THREAD = 2


def _piece_count(rows, nw):
    """Row pieces of a split GEMM at ``nw`` (>= 2) engine threads: at most 8, whole tiles."""
    return max(2, min(8, nw * _GEMM_PIECES_PER_THREAD, rows // _GEMM_TILE))


def _gemm_pieces(args, rows, has_z, nw):
    """``gemm_avx2.gemm`` on ``args`` (its first seven arguments) cut into row pieces of
    whole register tiles (:class:`Pieces`; every row is computed alone over the whole K, so
    the pieces give one call's bits), or None when the C workers or ``gemm_block`` are not
    loaded."""
    entry = pieces_entry()
    fn = _kernel_address("gemm_avx2.gemm_block")
    if entry is None or fn is None:
        return None
    cuts = row_cuts(rows, _piece_count(rows, nw), _GEMM_TILE)
    head = list(args) + [0, 0, has_z, _f64_bits(_NEG_INF), _f64_bits(_POS_INF)]
    blocks = []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        b = np.array(head, np.int64)
        b[7:9] = (r0, r1)
        blocks.append(b)
    return Pieces(fn, blocks, entry)


def _c_fused(A, B, bias, Z, gamma, beta, activation, epsilon, skip_norm, ctx):
    """FusedMatMul with its product by :func:`_c_gemm`: bias (and, without an activation,
    the residual) added in the kernel's stores, then the activation, the residual and the
    LayerNorm as the other paths run them (the compiled kernels when loaded); the adds in the
    unfused graph's order (``skip_norm``: the bare product, then SkipLayerNormalization's
    own sum). None when :func:`_c_gemm` declines or the epilogue's operands are not float32
    rows. A run whose every part took a compiled kernel leaves a pre-bound step in the
    node's context (:func:`_bind_step`) that later runs with the same arrays take."""
    if skip_norm:
        if activation or Z is None or gamma is None:
            return None
        y = _c_gemm(A, B, None, None, ctx)
        if y is None:
            return None
        from workbench.ops.contrib_transformer import skip_layer_norm_output
        out = skip_layer_norm_output(y, Z, gamma, beta, bias, epsilon)
        _bind_step(ctx, A, B, bias, Z, gamma, beta, "", epsilon, True, False, y.shape)
        return out
    if gamma is not None and (not _row_f32(gamma, B.shape[-1] if B.ndim == 2 else -1)
                              or (beta is not None and not _row_f32(beta, gamma.shape[0]))):
        return None
    y = _c_gemm(A, B, bias, None if activation else Z, ctx)
    if y is None:
        return None
    shape = y.shape
    compiled_epilogue = True
    if activation:
        act = _GELU_CODES.get(activation)
        z_rows = Z is None or (type(Z) is np.ndarray and Z.dtype == _F32
                               and Z.shape == y.shape and Z.flags.c_contiguous)
        if act is None or not z_rows or not rowwise.gelu_rows_inplace(y, act, None, Z):
            y = _matmul_epilogue(y, None, Z, activation, np)
            compiled_epilogue = False
    if gamma is not None:
        out = rowwise.layer_norm_rows(y, gamma, beta, epsilon)
        if out is None:
            return _layer_norm_op(y, gamma, beta, epsilon=epsilon)
        y = out
    if compiled_epilogue:
        _bind_step(ctx, A, B, bias, Z, gamma, beta, activation, epsilon, False, False, shape)
    return y


# --------------------------------------------------------------------------------------------
# The pre-bound step of a FusedMatMul / MatMul / Gemm node (inference plans, float32, C GEMM)
# --------------------------------------------------------------------------------------------
_MM_BOUND = "gemm_avx2_matmul_bound"   # ctx.extra: the node's pre-bound step
_MM_SEEN = "gemm_avx2_matmul_seen"     # ctx.extra: the arrays of the node's last full run
_DUMMY = np.zeros(1, np.float32)       # an unused kernel argument's address
_F64_BITS = np.dtype(np.int64)


def _f64_bits(v):
    return int(np.array(float(v)).view(_F64_BITS))


def _bound_step(ctx, A, B, bias, Z, gamma, beta):
    """The node's pre-bound step (:func:`_bind_step`) run on these inputs, or None (none
    kept, or it declined: the full path runs, and a declined step is dropped, so that the
    full path binds again, e.g. with the weights it re-packed after an in-place edit)."""
    bound = ctx.extra.get(_MM_BOUND)
    if bound is None:
        return None
    y = bound(A, B, bias, Z, gamma, beta)
    if y is None:
        ctx.extra.pop(_MM_BOUND, None)
    return y


def _bind_step(ctx, A, B, bias, Z, gamma, beta, activation, epsilon, skip_norm, trans_b,
               y_shape):
    """After a full run of this node that took the C GEMM and, for its epilogue, the compiled
    GELU / LayerNorm kernels: on the second such run with the same arrays (the same weight,
    bias, gamma, beta objects; A and Z of the same shapes), keep a pre-bound step in the
    context, one ``gemm_avx2.fused_block`` call that runs the product and calls those
    epilogue kernels from C (:func:`_make_bound`). A product of :data:`_GEMM_PIECES_MIN`
    multiply-adds or more is bound with row pieces (``gemm_avx2.checked_pieces``: the
    product and its epilogue per piece, over the C block pool at 2+ threads, one call at 1);
    without the C workers, work the full path would split over the Python pool is not bound
    (it keeps its split)."""
    key = (A.shape, id(B), id(bias), None if Z is None else Z.shape, id(gamma), id(beta))
    if ctx.extra.get(_MM_SEEN) != key:
        ctx.extra[_MM_SEEN] = key
        ctx.extra.pop(_MM_BOUND, None)
        return
    if _MM_BOUND in ctx.extra:
        return
    try:
        bound = _make_bound(ctx, A, B, bias, Z, gamma, beta, activation, epsilon, skip_norm,
                            trans_b, tuple(y_shape))
    except (KeyError, TypeError, ValueError, AttributeError):
        bound = None
    if bound is not None:
        ctx.extra[_MM_BOUND] = bound


def _kernel_address(name):
    """The entry address of the loaded compiled kernel ``name``, or None."""
    import ctypes

    k = compiled.kernel(name)
    return None if k is None else ctypes.cast(k.raw, ctypes.c_void_p).value


def _make_bound(ctx, A, B, bias, Z, gamma, beta, activation, epsilon, skip_norm, trans_b,
                y_shape):
    """A function ``(A, B, bias, Z, gamma, beta) -> Y or None`` that repeats this node's
    last run (see :func:`_bind_step`) with everything looked up, packed and checked once
    here: one int64 call block holding the packed weights', the epilogue kernels' and their
    parameters' addresses; a call checks the inputs' identity / shape / dtype / layout and
    that kernels are on, writes the A, Z and output objects' addresses and makes one ctypes
    call (``gemm_avx2.checked_block``), which compares the weight's sample and the bias
    bytes (the packing's check, :func:`_packed_weights`) in C before anything is computed
    and reads the arrays' data pointers from the objects. It
    answers None (the full path runs) when anything differs. The same kernels with the same
    arguments as the full path: the same bits. None when this run cannot be bound."""
    import ctypes
    import threading

    got = ctx.extra.get(_GEMM_PACK)
    gemm_bias = None if skip_norm else bias
    if got is None or got[0] is not B or got[1] is not gemm_bias \
            or not B.flags.c_contiguous:
        return None
    k = compiled.kernel("gemm_avx2.fused_block")
    if k is None:
        return None
    n, kk = B.shape if trans_b else B.shape[::-1]
    rows = A.size // kk
    entry = pieces_entry()
    split = rows * n * kk >= _GEMM_PIECES_MIN and rows > _GEMM_TILE
    retry = split and entry is None   # blas_worker not loaded yet (a cold start): bound
    if retry:                         # as one call until it is
        if rows * n * kk >= _PARALLEL_GEMM_MIN:
            return None    # the full path splits the rows over the pool
        split = False
    dp = compiled.data_pointer
    wp, bp = got[5]
    gemm_z = Z is not None and not activation and not skip_norm
    blk = np.zeros(_BLOCK, np.int64)
    blk[:12] = (0, dp(wp), dp(bp), dp(_DUMMY), 0, kk, n, 0, rows, int(gemm_z),
                _f64_bits(_NEG_INF), _f64_bits(_POS_INF))
    keep = [wp, bp, blk]
    if activation:
        act = _GELU_CODES.get(activation)
        addr = _kernel_address("transformer.gelu")
        cost = 2 if act == 1 else 4   # rowwise's split rule for the GELU kernel
        if act is None or addr is None \
                or (not split and rows * n * cost >= rowwise._PARALLEL_MIN):
            return None
        p = np.array((rows, n, 0, 0, int(Z is not None), act), np.int64)
        keep.append(p)
        blk[12:20] = (addr, dp(_DUMMY), 0, dp(_DUMMY), dp(_DUMMY), dp(p), 0, rows)
    if gamma is not None:
        addr = _kernel_address("transformer.layer_norm")
        if addr is None or (not split and rows * n * 4 >= rowwise._PARALLEL_MIN):
            return None
        if skip_norm:   # SkipLayerNormalization's sum (product + skip + bias) in the kernel
            if len(y_shape) not in (2, 3) or Z is None or Z.shape != y_shape \
                    or not rowwise.is_f32(Z) or not Z.flags.c_contiguous \
                    or not _row_f32(gamma, n) \
                    or (beta is not None and not _row_f32(beta, n)) \
                    or (bias is not None and not _row_f32(bias, n)):
                return None
            p = np.array((rows, n, rows, 1, int(bias is not None), int(beta is not None), 0,
                          0), np.int64)
        else:
            p = np.array((rows, n, 1, 0, 0, int(beta is not None), 0, 0), np.int64)
        keep.append(p)
        blk[20:32] = (addr, 0, dp(_DUMMY), dp(_DUMMY if not skip_norm or bias is None
                                              else bias),
                      dp(gamma), dp(_DUMMY if beta is None else beta), 0, dp(_DUMMY), dp(p),
                      0, rows, _f64_bits(float(epsilon)))
    idx, w_sample, b_bytes = got[2], got[3], got[4]
    off = compiled.data_pointer_offset()
    chk = _kernel_address("gemm_avx2.checked_block")
    if off is None or chk is None or B.dtype != _F32 \
            or (gemm_bias is not None and not gemm_bias.flags.c_contiguous):
        return None
    w_flat = B.reshape(-1)   # a view: the weights' buffer lives as long as the step
    sidx = np.ascontiguousarray(idx, np.int64)
    smp = np.frombuffer(w_sample, np.uint32).copy()
    bsnap = None if b_bytes is None else np.frombuffer(b_bytes, np.uint8).copy()
    keep += [w_flat, sidx, smp, bsnap]
    norm, gelu = gamma is not None, bool(activation)
    blk[32:40] = (sidx.size, dp(sidx), dp(w_flat), dp(smp),
                  0 if bsnap is None else bsnap.size, 0 if bsnap is None else dp(gemm_bias),
                  0 if bsnap is None else dp(bsnap), off)
    blk[43:46] = (3 if gemm_z else 16 if gelu else 22, 26 if norm else 4,
                  14 if gelu and not norm else -1)
    # with a LayerNorm the product is an intermediate: one buffer of the step's own
    if norm:
        mid = np.empty(y_shape, _F32)
        blk[4] = blk[14] = blk[21] = dp(mid)
        keep.append(mid)
    view = (ctypes.c_int64 * _BLOCK).from_buffer(blk)
    call = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(chk)
    call_split = None
    if split:   # row pieces over the C block pool at 2+ threads (gemm_avx2.checked_pieces)
        chkp = _kernel_address("gemm_avx2.checked_pieces")
        fb = _kernel_address("gemm_avx2.fused_block")
        if chkp is None or fb is None:
            return None
        cuts = row_cuts(rows, _piece_count(rows, max(2, n_workers())), _GEMM_TILE)
        pieces = Pieces(fb, [np.zeros(32, np.int64) for _ in cuts[1:]], entry)
        table = np.array([len(pieces.blocks), *[dp(b) for b in pieces.blocks], *cuts],
                         np.int64)
        keep += [pieces, table]
        blk[46:49] = (pieces.runner, pieces.address, dp(table))
        call_split = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(chkp)
    addr = dp(blk)
    a_shape, a_strides, z_shape = A.shape, A.strides, None if Z is None else Z.shape
    z_strides = None if Z is None else Z.strides
    empty, f32, nd, on = np.empty, _F32, np.ndarray, compiled._ENABLED
    busy = threading.Lock()   # the block is shared: a second thread takes the full path
    nworkers = n_workers

    def bound(A_, B_, bias_, Z_, gamma_, beta_, _keep=tuple(keep)):
        # _keep: the packed weights, parameters, samples and block live as long as this
        # function. Checked here: the arrays' identity, A's and Z's type, dtype, shape and
        # layout (the strides of the bound run, else numpy's C-contiguous flag), kernels
        # on; in C (gemm_avx2.checked_block): the weights' sample and the bias bytes.
        if B_ is not B or bias_ is not bias or gamma_ is not gamma or beta_ is not beta \
                or type(A_) is not nd or A_.dtype is not f32 or A_.shape != a_shape \
                or (A_.strides != a_strides and not A_.flags.c_contiguous) \
                or not (on and on[0]):
            return None
        if Z_ is None:
            if z_shape is not None:
                return None
        elif type(Z_) is not nd or Z_.dtype is not f32 or Z_.shape != z_shape \
                or (Z_.strides != z_strides and not Z_.flags.c_contiguous):
            return None
        if retry and pieces_entry() is not None:
            return None    # the C workers are loaded now: the full path binds with pieces
        if not busy.acquire(False):
            return None
        try:
            y = empty(y_shape, f32)
            view[40] = id(A_)
            if Z_ is not None:
                view[41] = id(Z_)
            view[42] = id(y)
            if call_split is not None and nworkers() > 1:
                return None if call_split(addr) else y
            return None if call(addr) else y
        finally:
            busy.release()
    return bound


_BLOCK = 49   # slots of a pre-bound step's call block (gemm_avx2.checked_block / _pieces)


def _matmul_epilogue(y, bias, Z, activation, xp):
    """FusedMatMul's ``activation(y + bias) + Z`` on its fresh product ``y``."""
    if activation in ("Gelu", "GeluTanh") and rowwise.is_f32(y) and y.ndim \
            and y.flags.c_contiguous and (bias is None or (rowwise.is_f32(bias)
                                                           and bias.ndim <= y.ndim)) \
            and (Z is None or rowwise.is_f32(Z)):
        # float32 GELU: bias, activation and residual in one compiled pass when loaded
        z = Z if Z is None or Z.shape == y.shape else None
        if rowwise.gelu(y, activation, bias=bias, residual=z, out=y) is not None:
            if Z is not None and z is None:
                y = _add_into(y, Z, xp)
            return y
    if bias is not None:
        if bias.dtype == y.dtype and _broadcasts_into(bias.shape, y.shape):
            y += bias
        else:
            y = ensure_array(y + bias, xp)
    if activation:
        if y.dtype.kind != "f":
            raise InputError(f"FusedMatMul: activation {activation!r} needs a float product, "
                             f"got {y.dtype}")
        cd = compute_dtype(y.dtype)
        if cd != y.dtype:  # float16 / bfloat16: computed in float32
            yc = y.astype(cd)
            _epilogue_inplace(yc, activation)
            y = yc.astype(y.dtype)
        else:
            _epilogue_inplace(y, activation)
    if Z is not None:
        y = _add_into(y, Z, xp)
    return y


def _add_into(y, Z, xp):
    """``y + Z``, in place on ``y`` when Z broadcasts into it."""
    if Z.dtype == y.dtype and _broadcasts_into(Z.shape, y.shape):
        y += Z
        return y
    return ensure_array(y + Z, xp)


# --------------------------------------------------------------------------------------------
# FusedAttention (internal: made by the inference pass workbench.graph.passes.fuse_attention)
# --------------------------------------------------------------------------------------------

def _layout_reshape(x, shape):
    """Reshape-14 of ``x`` to ``shape`` (0 copies a dimension, -1 is inferred)."""
    dims = shape.tolist() if type(shape) is np.ndarray and shape.ndim == 1 else None
    if dims and min(dims) >= -1 and 0 not in dims and type(x) is np.ndarray:
        try:    # without 0 the ONNX and numpy rules are the same
            return x.reshape(dims)
        except ValueError:
            pass
    return reshape(x, shape)    # the kernel's rules, and its message for a bad shape


def _layout_transpose(x, perm):
    """Transpose of ``x`` by ``perm``."""
    if type(x) is np.ndarray and len(perm) == x.ndim and min(perm) >= 0:
        try:
            return x.transpose(perm)
        except ValueError:
            pass
    return transpose(x, perm=perm)   # the kernel's message for a bad perm


def _attention_layout(x, shape, perm):
    """``Transpose(Reshape(x, shape), perm)`` (each step only where given: ``shape`` None, or
    ``perm`` empty, skips it) with the Reshape-14 and Transpose kernels' semantics."""
    if shape is not None:
        x = _layout_reshape(x, shape)
    if perm:
        x = _layout_transpose(x, perm)
    return x


@kernel("FusedAttention", since=1, domain=FUSED_DOMAIN, host_read_inputs=(4, 5, 6, 7),
        wants_ctx=True)
def fused_attention(Q, K, V, M=None, q_shape=None, k_shape=None, v_shape=None, out_shape=None,
                    *, scale=1.0, scale_op="", mask="", fill=0.0, q_perm=(), k_perm=(),
                    v_perm=(), out_perm=(), ctx=None):
    """``Softmax(mask(scale(Q @ K)), axis=-1) @ V`` in one node (``K`` as the graph gives it,
    already transposed): ``scale_op`` "mul" / "div" by ``scale`` or "" (none); ``mask`` ""
    (none), "add" (``+ M``), "fill_where_true" (``Where(M, fill, s)``) or "fill_where_false"
    (``Where(M, s, fill)``). The scores are scaled, masked and normalised in place.

    The head split and merge around it may be folded in (``passes.fuse_attention_layout``):
    each of Q, K, V is first reshaped to ``q_shape`` / ``k_shape`` / ``v_shape`` (Reshape
    semantics: 0 copies a dimension, -1 is inferred) where given and then transposed by
    ``q_perm`` / ``k_perm`` / ``v_perm`` where not empty; the result is transposed by
    ``out_perm`` and then reshaped to ``out_shape`` (same rules).

    In an inference plan (``ctx`` given, not training) float32 host inputs run as one call of
    the C kernel ``attention_avx2.attention`` (:func:`_attention_c`, when it is built for this
    CPU): the same semantics (the compiled softmax's NaN / -inf rules), results that differ
    from the BLAS path below by float rounding only, the same for any thread count; both
    ``wb.load(m).run`` and ``backend.prepare(m).run`` take it."""
    if scale_op not in ("", "mul", "div") or mask not in ("", "add", "fill_where_true",
                                                          "fill_where_false"):
        raise InputError(f"FusedAttention: unknown scale_op {scale_op!r} or mask {mask!r}")
    if ctx is not None and not ctx.training:
        y = _attention_c(Q, K, V, M, q_shape, k_shape, v_shape, out_shape, scale, scale_op,
                         mask, fill, q_perm, k_perm, v_perm, out_perm, ctx)
        if y is not None:
            return y
    if type(Q) is np.ndarray and type(K) is np.ndarray and type(V) is np.ndarray \
            and Q.dtype == _F32 and K.dtype == _F32 and V.dtype == _F32:
        y = _attention_f32(Q, K, V, M, q_shape, k_shape, v_shape, out_shape, scale, scale_op,
                           mask, fill, q_perm, k_perm, v_perm, out_perm)
        if y is not None:
            return y
    Q = _attention_layout(Q, q_shape, q_perm)
    K = _attention_layout(K, k_shape, k_perm)
    V = _attention_layout(V, v_shape, v_perm)
    xp = xp_of(Q, K)
    s = ensure_array(matmul(Q, K), xp)
    if s.dtype.kind != "f":
        raise InputError(f"FusedAttention: the scores must be float, got {s.dtype}")
    p = _compiled_scores(s, M, scale, scale_op, mask, fill)
    if p is not None:
        return _attention_out(p, V, out_perm, out_shape)
    if scale_op == "mul":
        s *= s.dtype.type(scale)
    elif scale_op == "div":
        s /= s.dtype.type(scale)
    if mask == "add":
        if M.dtype == s.dtype and _broadcasts_into(M.shape, s.shape):
            s += M
        else:
            s = ensure_array(s + M, xp)
    elif mask:
        cond = M if mask == "fill_where_true" else xp.logical_not(M)
        if _broadcasts_into(cond.shape, s.shape):
            xp.copyto(s, s.dtype.type(fill), where=cond)
        else:
            s = xp.where(cond, s.dtype.type(fill), s)
    if type(s) is np.ndarray and s.dtype.itemsize >= 4 and s.size:
        # the scores are this node's own array: Softmax(-1) computed in place on it
        p = softmax_core(np, s, -1, overwrite=True)
    else:
        p = softmax(s, axis=-1)
    return _attention_out(p, V, out_perm, out_shape)


#: FusedAttention's lean float32 calls, by everything but the data: the head split dims,
#: the permutations, and the softmax kernel's packed parameters (see :func:`_attention_f32`)
_ATTENTION_CALLS: dict = {}
_ATTENTION_CALLS_MAX = 256


def _dims(shape):
    """A Reshape target (an int64 host vector) as a tuple, or None when not given."""
    if shape is None:
        return None
    if type(shape) is not np.ndarray or shape.ndim != 1:
        return False
    return tuple(shape.tolist())


def _attention_f32(Q, K, V, M, q_shape, k_shape, v_shape, out_shape, scale, scale_op, mask,
                   fill, q_perm, k_perm, v_perm, out_perm):
    """FusedAttention on float32 host arrays with its per-shape work done once: the reshape
    targets checked, the products' sizes, the softmax's mask strides and packed parameters
    are kept by the call's shapes and attributes, and a call makes the same numpy views, the
    same ``matmul`` calls and the same compiled softmax call as the general path (so the same
    bits). None when the call is outside this case (the general path then runs)."""
    if M is not None and type(M) is not np.ndarray:
        return None
    mshape = None if M is None else (M.shape, M.dtype.char)
    dq, dk, dv, do = _dims(q_shape), _dims(k_shape), _dims(v_shape), _dims(out_shape)
    key = (Q.shape, K.shape, V.shape, mshape, dq, dk, dv, do, tuple(q_perm), tuple(k_perm),
           tuple(v_perm), tuple(out_perm), scale, scale_op, mask, fill)
    plan = _ATTENTION_CALLS.get(key)
    if plan is None:
        plan = _attention_plan(Q, K, V, M, dq, dk, dv, do, scale, scale_op, mask, fill,
                               q_perm, k_perm, v_perm, out_perm)
        if len(_ATTENTION_CALLS) >= _ATTENTION_CALLS_MAX:
            _ATTENTION_CALLS.clear()
        _ATTENTION_CALLS[key] = plan
    if plan is False:
        return None
    raw = rowwise.softmax_kernel()
    if raw is None:
        return None
    qv, kv, vv = Q, K, V
    if dq is not None:
        qv = qv.reshape(dq)
    if q_perm:
        qv = qv.transpose(q_perm)
    if dk is not None:
        kv = kv.reshape(dk)
    if k_perm:
        kv = kv.transpose(k_perm)
    if dv is not None:
        vv = vv.reshape(dv)
    if v_perm:
        vv = vv.transpose(v_perm)
    s = np.matmul(qv, kv)
    madd = mfill = None
    if mask == "add":
        madd = M if M.flags.c_contiguous else np.ascontiguousarray(M)
    elif mask:
        cond = M if mask == "fill_where_true" else np.logical_not(M)
        mfill = (cond if cond.flags.c_contiguous else np.ascontiguousarray(cond)).view(np.uint8)
    rowwise.softmax_call(raw, s, plan, madd, mfill, scale if scale_op else None, fill)
    return _attention_out(s, vv, out_perm, None if do is None else out_shape)


def _attention_plan(Q, K, V, M, dq, dk, dv, do, scale, scale_op, mask, fill, q_perm, k_perm,
                    v_perm, out_perm):
    """The per-shape part of :func:`_attention_f32` (False: not its case): checks what the
    general path would (a reshape target without 0, perms of the rank, the score product a
    small one-call product, the mask one the compiled softmax takes) and packs the softmax
    kernel's parameters."""
    if False in (dq, dk, dv, do) or scale_op not in ("", "mul", "div"):
        return False
    shapes = []
    for x, d, perm in ((Q, dq, q_perm), (K, dk, k_perm), (V, dv, v_perm)):
        if d is not None and (not d or 0 in d or min(d) < -1):
            return False
        try:
            x = np.empty(x.shape, np.uint8)[...] if d is None else \
                np.empty(x.shape, np.uint8).reshape(d)
            if perm:
                if len(perm) != x.ndim or min(perm) < 0:
                    return False
                x = x.transpose(perm)
        except ValueError:
            return False
        shapes.append(x.shape)
    sq, sk, _ = shapes
    # (the general path multiplies a 2-D K as one GEMM over Q's rows: not this case)
    if len(sq) < 2 or len(sk) < 3 or sq[-1] != sk[-2] or sq[-1] == 0:
        return False
    try:
        s_shape = np.broadcast_shapes(sq[:-2], sk[:-2]) + (sq[-2], sk[-1])
    except ValueError:
        return False
    k = sq[-1]
    out_bound = (math.prod(sq) // k) * (math.prod(sk) // k)
    if out_bound * k >= _PARALLEL_GEMM_MIN or out_bound * 4 > _UNCHECKED_BYTES \
            or 0 in s_shape:
        return False
    if mask and (M is None or M.dtype != (_F32 if mask == "add" else np.bool_)
                 or not _broadcasts_into(M.shape, s_shape)):
        return False
    return rowwise.softmax_params(s_shape, None if M is None or not mask else M.shape,
                                  mask == "add", scale_op == "div", bool(scale_op))


def _compiled_scores(s, M, scale, scale_op, mask, fill):
    """FusedAttention's scale, mask and softmax in place on the fresh float32 scores ``s`` by
    the compiled kernel (``transformer.softmax``); None when it does not apply (the numpy
    path then runs on the untouched scores)."""
    if not rowwise.is_f32(s) or not s.ndim or not s.size or not s.flags.c_contiguous:
        return None
    add = where = None
    if mask == "add":
        if not rowwise.is_f32(M) or not _broadcasts_into(M.shape, s.shape):
            return None
        add = M
    elif mask:
        if type(M) is not np.ndarray or M.dtype != np.bool_ \
                or not _broadcasts_into(M.shape, s.shape):
            return None
        where = M if mask == "fill_where_true" else np.logical_not(M)
    return rowwise.softmax(s, out=s, scale=scale if scale_op else None,
                           divide=scale_op == "div", add=add, fill_where=where, fill=fill)


def _attention_out(p, V, out_perm, out_shape):
    """``p @ V``, then ``out_perm`` and ``out_shape``. The usual head merge (perm (0, 2, 1, 3)
    then a reshape) is written by the product itself: float32 BLAS writes each head's rows
    straight into a (B, S, H, Dv) buffer, so the merge costs no copy."""
    if len(out_perm) == 4 and tuple(out_perm) == (0, 2, 1, 3) and rowwise.is_f32(p) \
            and rowwise.is_f32(V) and p.ndim == 4 and V.ndim == 4 \
            and p.shape[:2] == V.shape[:2] and p.shape[-1] == V.shape[-2]:
        b, h, s = p.shape[:3]
        buf = np.empty((b, s, h, V.shape[-1]), np.float32)
        np.matmul(p, V, out=buf.transpose(0, 2, 1, 3))
        return buf if out_shape is None else _layout_reshape(buf, out_shape)
    y = matmul(p, V)
    if out_perm:
        y = _layout_transpose(y, out_perm)
    if out_shape is not None:
        y = _layout_reshape(y, out_shape)
    return y


# FusedAttention in one compiled call (compiled/kernels/attention_avx2.c), inference plans only
_ATT_C = "attention_avx2.attention"
_ATT_BOUND = "attention_avx2_bound"   # node-context key of the node's pre-bound call
_ATT_SKIP = "attention_avx2_skip"     # ... of the inputs it did not take last time
#: element-operations (pairs * Sq * Sk * (D + Dv)) from which the (batch, head) pairs are
#: split over the engine's threads. Measured on the 2-core AMD EPYC (AVX2) at load 4.5-5,
#: two threads (wall clock): BERT-like b8 (1 M) 280-350 us in one call vs 565-590 us split,
#: 8 M (2 x 4 heads x 256 x 256 x 16) 3.9 ms vs 4.7 ms; so only far larger attention splits
_ATT_SPLIT_MIN = 1 << 24
#: element-operations from which the pairs are cut into pieces over the C block pool
#: instead (:class:`workbench.ops.parallel.Pieces`: no Python pool hand-off), at 2+ threads;
#: pieces per engine thread
_ATT_PIECES_MIN = 1 << 19
_ATT_PIECES_PER_THREAD = 2
_ATT_WORK_MAX = 1 << 22    # scratch floats per call block above which BLAS runs instead
_ATT_SCRATCH_MAX = 1 << 23  # scratch floats of a node's split blocks together (32 MB)
_ATT_MASKS = {"": 0, "add": 1, "fill_where_true": 2, "fill_where_false": 3}


def _attention_c(Q, K, V, M, q_shape, k_shape, v_shape, out_shape, scale, scale_op, mask,
                 fill, q_perm, k_perm, v_perm, out_perm, ctx):
    """FusedAttention by the compiled ``attention_avx2.attention`` kernel through the node's
    pre-bound call (made here at the node's first run, and again when the inputs' shapes,
    strides or Reshape targets change); None when the kernel is not loaded or the call is
    outside its case (the numpy / BLAS path then runs and, for bad input, raises)."""
    bound = ctx.extra.get(_ATT_BOUND)
    if bound is not None:
        y = bound(Q, K, V, M, q_shape, k_shape, v_shape, out_shape)
        if y is not None:
            return y
    kern = compiled.kernel(_ATT_C)
    if kern is None:
        return None
    # inputs the kernel did not take last time are not looked at again (the same shapes,
    # strides, dtypes and Reshape targets)
    sig = tuple((x.shape, x.strides, x.dtype) if type(x) is np.ndarray else type(x)
                for x in (Q, K, V, M)) + tuple(_dims(s) for s in (q_shape, k_shape, v_shape,
                                                                  out_shape))
    if ctx.extra.get(_ATT_SKIP) == sig:
        return None
    bound = _attention_bind(kern, Q, K, V, M, q_shape, k_shape, v_shape, out_shape, scale,
                            scale_op, mask, fill, q_perm, k_perm, v_perm, out_perm)
    if bound is None:
        ctx.extra.pop(_ATT_BOUND, None)
        ctx.extra[_ATT_SKIP] = sig
        return None
    ctx.extra.pop(_ATT_SKIP, None)
    ctx.extra[_ATT_BOUND] = bound
    return bound(Q, K, V, M, q_shape, k_shape, v_shape, out_shape)


def _same_dims(given, d):
    """Whether the Reshape target ``given`` (None, or an int64 host vector) is ``d`` (what
    :func:`_dims` made of the kept one)."""
    if given is None or d is None:
        return given is None and d is None
    return type(given) is np.ndarray and given.ndim == 1 and tuple(given.tolist()) == d


def _elem_strides(view, base, nbatch):
    """``view``'s element strides padded in front to ``nbatch`` batch dims + 2 (a dimension
    of size 1 gets stride 0, so it broadcasts), or None when ``view`` is not a view of
    ``base`` at its first element (numpy had to copy) or a stride is not whole elements."""
    if base is not None and (not np.may_share_memory(view, base) or view.size == 0
                             or view.__array_interface__["data"][0]
                             != base.__array_interface__["data"][0]):
        return None
    item = view.itemsize
    if any(s % item for s in view.strides):
        return None
    st = [0 if d == 1 else s // item for d, s in zip(view.shape, view.strides)]
    return [0] * (nbatch + 2 - len(st)) + st


def _attention_bind(kern, Q, K, V, M, q_shape, k_shape, v_shape, out_shape, scale, scale_op,
                    mask, fill, q_perm, k_perm, v_perm, out_perm):
    """The pre-bound call of :func:`_attention_c` for inputs like these (the same shapes,
    strides, mask and Reshape targets): a function ``(Q, K, V, M, q_shape, k_shape, v_shape,
    out_shape) -> Y or None`` that writes the arrays' addresses into call blocks made here
    and calls the kernel; None when the kernel does not take this call: not float32 host
    arrays, a view numpy would copy, ranks past 4, shapes that do not multiply (the general
    path then raises), a mask that is not float32 ("add") / bool or does not broadcast into
    the scores, K or D of size 0."""
    arrays = (Q, K, V)
    if any(type(x) is not np.ndarray or x.dtype != _F32 for x in arrays) \
            or scale_op not in ("", "mul", "div") or mask not in _ATT_MASKS:
        return None
    if mask:
        if type(M) is not np.ndarray or M.dtype != (_F32 if mask == "add" else np.bool_):
            return None
    dims = [_dims(s) for s in (q_shape, k_shape, v_shape, out_shape)]
    if False in dims:
        return None
    views = []
    try:
        for x, d, perm in zip(arrays, dims[:3], (q_perm, k_perm, v_perm)):
            v = x
            if d is not None:
                if not d or 0 in d or min(d) < -1:
                    return None
                v = v.reshape(d)
            if perm:
                if len(perm) != v.ndim or min(perm) < 0:
                    return None
                v = v.transpose(perm)
            views.append(v)
    except ValueError:
        return None
    qv, kv, vv = views
    if not all(2 <= v.ndim <= 4 for v in views):
        return None
    Sq, D = qv.shape[-2:]
    Sk = kv.shape[-1]
    Dv = vv.shape[-1]
    if kv.shape[-2] != D or vv.shape[-2] != Sk or D == 0 or Sk == 0:
        return None
    try:
        s_batch = np.broadcast_shapes(qv.shape[:-2], kv.shape[:-2])
        o_batch = np.broadcast_shapes(s_batch, vv.shape[:-2])
    except ValueError:
        return None
    if len(o_batch) > 2:
        return None
    nb = 2
    strides = [_elem_strides(v, x, nb) for v, x in zip(views, arrays)]
    if None in strides:
        return None
    s_shape = s_batch + (Sq, Sk)
    mst = [0, 0, 0, 0]
    if mask:
        try:
            if np.broadcast_shapes(M.shape, s_shape) != s_shape:
                return None
        except ValueError:
            return None
        mst = _elem_strides(np.broadcast_to(M, s_shape), None, nb)
        if mst is None:
            return None
    y_shape = o_batch + (Sq, Dv)
    if out_perm:
        perm = [int(p) for p in out_perm]
        if sorted(perm) != list(range(len(y_shape))):
            return None
        final = np.empty([y_shape[p] for p in perm], np.float32)
        yv = final.transpose(np.argsort(perm))
    else:
        final = np.empty(y_shape, np.float32)
        yv = final
    try:
        ret_shape = final.shape if dims[3] is None \
            else _layout_reshape(final, out_shape).shape
    except (ValueError, InputError, ShapeError):
        return None
    yst = _elem_strides(yv, None, nb)
    if yst is None:
        return None
    B, H = ((1, 1) + o_batch)[-2:]
    pairs = B * H
    size = int(np.prod(ret_shape))
    wf = attention_work_floats(Sq, Sk, D, Dv)
    if wf > _ATT_WORK_MAX:
        return None
    work = pairs * Sq * Sk * (D + Dv)
    entry = pieces_entry()
    retry = entry is None and work >= _ATT_PIECES_MIN   # blas_worker not loaded yet
    if entry is not None and work >= _ATT_PIECES_MIN:   # pieces over the C block pool
        n_split = max(1, min(pairs, 8, max(2, n_workers()) * _ATT_PIECES_PER_THREAD,
                             _ATT_SCRATCH_MAX // wf))
    else:
        entry = None
        n_split = max(1, min(pairs, 8, _ATT_SCRATCH_MAX // wf)) \
            if work >= _ATT_SPLIT_MIN else 1
    scratch = [np.empty(wf, np.float32) for _ in range(n_split)]
    ints = [H, Sq, Sk, D, Dv] + strides[0][:2] + strides[0][2:] + strides[1][:2] \
        + strides[1][2:] + strides[2][:2] + strides[2][2:] + yst + mst \
        + [{"": 0, "mul": 1, "div": 2}[scale_op], _ATT_MASKS[mask]]
    rows = min(Sq, _ATT_ROWS)
    dp = compiled.data_pointer

    def block(p0, p1, work_):
        blk = np.zeros(38, np.int64)
        blk[5] = dp(work_)
        blk[6:33] = ints
        blk[33:36] = (p0, p1, rows)
        blk.view(np.float64)[36:] = (float(scale), float(fill))
        return blk
    single = block(0, pairs, scratch[0])
    cuts = [pairs * i // n_split for i in range(n_split + 1)]
    split = [block(cuts[i], cuts[i + 1], scratch[i]) for i in range(n_split)]
    raw = kern.raw
    # per block: its address, a ctypes view to write the array addresses into, and what
    # it points to that nothing else keeps alive (the block itself, its scratch)
    slots = [(dp(b), (ctypes.c_int64 * 5).from_buffer(b), (b, w))
             for b, w in zip([single] + split, scratch[:1] + scratch)]
    many = slots[1:] if n_split > 1 else ()
    pieces = Pieces(ctypes.cast(raw, ctypes.c_void_p).value, split, entry) \
        if many and entry is not None else None
    keys = (Q.shape, Q.strides, K.shape, K.strides, V.shape, V.strides)
    mkey = None if not mask else (M.shape, M.strides, M.dtype)
    (kq, kk, kv, ko), (dq, dk, dv, do) = (q_shape, k_shape, v_shape, out_shape), dims
    enabled, empty, nd = compiled.enabled, np.empty, np.ndarray
    busy = threading.Lock()   # the blocks are shared: a second thread binds its own
    addr1, view1 = slots[0][:2]
    # one block: the arrays' objects go to gemm_avx2.objects_call, which writes their data
    # pointers into the block and calls the kernel (no data pointer read in Python)
    tcall, off = compiled.kernel("gemm_avx2.objects_call"), compiled.data_pointer_offset()
    tramp = tview = None
    if tcall is not None and off is not None:
        tramp = np.zeros(9, np.int64)
        tramp[:4] = (ctypes.cast(raw, ctypes.c_void_p).value, addr1, off, 5)
        tview = (ctypes.c_int64 * 5).from_buffer(tramp, 32)
        tcall, taddr = tcall.raw, dp(tramp)

    def bound(Q_, K_, V_, M_, qs, ks, vs, os_):
        if type(Q_) is not nd or type(K_) is not nd or type(V_) is not nd \
                or Q_.dtype is not _F32 or K_.dtype is not _F32 or V_.dtype is not _F32 \
                or (Q_.shape, Q_.strides, K_.shape, K_.strides, V_.shape, V_.strides) != keys:
            return None
        if mkey is not None and (type(M_) is not nd
                                 or (M_.shape, M_.strides, M_.dtype) != mkey):
            return None
        # the Reshape targets: the same arrays, or the same values (graphs compute them)
        if not ((qs is kq or _same_dims(qs, dq)) and (ks is kk or _same_dims(ks, dk))
                and (vs is kv or _same_dims(vs, dv)) and (os_ is ko or _same_dims(os_, do))) \
                or not enabled():
            return None
        if retry and pieces_entry() is not None:
            return None    # the C workers are loaded now: bound again with pieces
        y = empty(ret_shape, _F32)
        if not size:
            return y
        if not busy.acquire(False):
            return None
        try:
            if tview is not None and (not many or n_workers() < 2):
                tview[:] = (id(Q_), id(K_), id(V_), id(M_) if mkey is not None else 0, id(y))
                tcall(taddr)
                return y
            ptrs = (dp(Q_), dp(K_), dp(V_), dp(M_) if mkey is not None else 0, dp(y))
            if not many or n_workers() < 2:
                view1[:] = ptrs
                raw(addr1)
                return y
            for _, view, _ in many:
                view[:] = ptrs
            if pieces is not None:
                pieces.run()
                return y

            def run(chunk):
                for addr, _, _ in chunk:
                    raw(addr)
            run_blocks(np, many, run, work)
            return y
        finally:
            busy.release()
    bound.blocks = slots   # the call blocks and their scratch live as long as the call
    bound.pieces = pieces
    bound.objects_block = tramp   # (and objects_call's block)
    return bound
