"""Gradients of MatMul (1-D promotion, batched, broadcast batch dimensions) and Gemm.

On numpy each product is one single-threaded BLAS call (stacked products may be split over
their batch axis: ``ops.parallel.exact_matmul``), so a step's gradients have the same bits at
any thread count: splitting a 2-D product over threads changes its rounding (and at a
BERT-like step's sizes was slower too). BLAS' own threads are kept out (they busy-wait and
collapse on a loaded machine, and change the bits as well).

The gradients' products stay on BLAS, not the inference plans' C GEMM (``gemm_avx2.gemm``),
by measurement, not for their bits: that kernel reads its right operand packed into column
panels, and here that operand changes every call (W^T, the output gradient), so each product
would pack it first. On the BERT-like step's shapes (2-core AMD EPYC, AVX2, one thread, CPU
us, OpenBLAS 0.3.31 / C GEMM with its packing): g @ W^T 256x64x64 32-44 / 39-61, 256x256x64
123-128 / 145-172, 256x64x256 123-144 / 147-165; X^T @ g 30-32 / 59-65, 117-137 / 261-283,
114-134 / 232-253 (``benchmarks/README.md``, "The BERT-like training step without scipy").
"""

from __future__ import annotations

import contextlib

from workbench.autodiff.rules import gradient, unbroadcast
from workbench.ops.parallel import (
    blas_controller,
    defer_matmul,
    exact_matmul,
    n_workers,
    single_threaded_blas,
)


def _blas(xp):
    """Context for a rule's products: single-threaded BLAS on numpy with worker threads."""
    if xp.__name__ == "numpy" and n_workers() > 1:
        return single_threaded_blas(blas_controller())
    return contextlib.nullcontext()


def _mm(xp, a, b):
    if xp.__name__ == "numpy" and a.ndim >= 2 and b.ndim >= 2 and a.dtype == b.dtype:
        # the same bits at any thread count: a 2-D product is one BLAS call (the rules run
        # inside _blas: one BLAS thread), a stack may split over its batch axis only
        if a.ndim == 2 and b.ndim == 2:
            return a @ b
        return exact_matmul(xp, a, b)
    return a @ b


def _swap(a):
    return a.swapaxes(-1, -2)


def _leaf(ctx, i) -> bool:
    """Whether input ``i`` of the node is a leaf of the tape (a parameter): its gradient is
    read only after the backward (by the optimizer), or where the backward engine adds two
    of them (it settles queued products first), so its product may go to the BLAS worker."""
    p = ctx.parents[i] if len(ctx.parents) > i else None
    return p is not None and type(p) is not tuple


def _mm_later(xp, a, b, defer):
    """``a @ b``, queued on the BLAS worker (``ops.parallel.defer_matmul``: the same bits as
    here) when ``defer`` and the worker takes it, else computed now."""
    if defer:
        out = defer_matmul(a, b)
        if out is not None:
            return out
    return _mm(xp, a, b)


def matmul_grads(xp, g, a, b, need_a=True, need_b=True, defer_b=False):
    """Gradients of ``a @ b`` (numpy semantics) with respect to ``a`` and ``b``. With
    ``defer_b`` a 2-D ``b``'s gradient may be computed on the BLAS worker: its array is then
    complete only once ``ops.parallel.settle()`` returns (the backward engine settles)."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = xp.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = xp.expand_dims(g2, -1)
    ga = gb = None
    k, n = b2.shape[-2], b2.shape[-1]
    with _blas(xp):
        if need_b:   # first: a queued product then runs while ga is computed here
            if b2.ndim == 2 and a2.ndim >= 2:
                gb = _mm_later(xp, a2.reshape(-1, k).T, g2.reshape(-1, n), defer_b) \
                    if a2.ndim > 2 else _mm_later(xp, a2.T, g2, defer_b)
            else:
                gb = unbroadcast(_mm(xp, _swap(a2), g2), b2.shape)
            gb = gb.reshape(b.shape)
        if need_a:
            if b2.ndim == 2:  # one big GEMM instead of a batch of small ones
                ga = _mm(xp, g2.reshape(-1, n), b2.T).reshape(g2.shape[:-1] + (k,))
            else:
                ga = _mm(xp, g2, _swap(b2))
            ga = unbroadcast(ga, a2.shape).reshape(a.shape)
    return ga, gb


@gradient("MatMul")
def matmul_grad(ctx, grads_out, inputs, outputs, **attrs):
    a, b = inputs
    need = ctx.needs_input_grad
    return matmul_grads(ctx.xp, grads_out[0], a, b, need[0], need[1],
                        need[1] and b.ndim == 2 and _leaf(ctx, 1))


@gradient("Gemm")
def gemm_grad(ctx, grads_out, inputs, outputs, *, alpha=1.0, beta=1.0, transA=0,  # noqa: N803
              transB=0, **attrs):
    g = grads_out[0]
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    need = ctx.needs_input_grad
    t = g.dtype.type
    ap = a.T if transA else a
    bp = b.T if transB else b
    ga = gb = gc = None
    xp = ctx.xp
    with _blas(xp):
        if need[1]:  # first: a queued product then runs while ga is computed here
            later = alpha == 1.0 and _leaf(ctx, 1)   # (a scaled gradient is computed now)
            gb = _mm_later(xp, g.T, ap, later) if transB else _mm_later(xp, ap.T, g, later)
            if alpha != 1.0:
                gb *= t(alpha)
        if need[0]:  # computed directly in the input's layout (no transposed copy)
            ga = _mm(xp, bp, g.T) if transA else _mm(xp, g, bp.T)
            if alpha != 1.0:
                ga *= t(alpha)
    if c is not None and len(need) > 2 and need[2]:
        gc = unbroadcast(g * t(beta) if beta != 1.0 else g, c.shape)
    return ga, gb, gc
