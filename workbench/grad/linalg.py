"""Gradients of MatMul (1-D promotion, batched, broadcast batch dimensions) and Gemm."""

from __future__ import annotations

from workbench.grad import gradient, unbroadcast


def _swap(a):
    return a.swapaxes(-1, -2)


def matmul_grads(xp, g, a, b, need_a=True, need_b=True):
    """Gradients of ``a @ b`` (numpy semantics) with respect to ``a`` and ``b``."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = xp.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = xp.expand_dims(g2, -1)
    ga = gb = None
    k, n = b2.shape[-2], b2.shape[-1]
    if need_a:
        if b2.ndim == 2:  # one big GEMM instead of a batch of small ones
            ga = (g2.reshape(-1, n) @ b2.T).reshape(g2.shape[:-1] + (k,))
        else:
            ga = g2 @ _swap(b2)
        ga = unbroadcast(ga, a2.shape).reshape(a.shape)
    if need_b:
        if b2.ndim == 2 and a2.ndim >= 2:
            gb = a2.reshape(-1, k).T @ g2.reshape(-1, n) if a2.ndim > 2 else a2.T @ g2
        else:
            gb = unbroadcast(_swap(a2) @ g2, b2.shape)
        gb = gb.reshape(b.shape)
    return ga, gb


@gradient("MatMul")
def matmul_grad(ctx, grads_out, inputs, outputs, **attrs):
    a, b = inputs
    need = ctx.needs_input_grad
    return matmul_grads(ctx.xp, grads_out[0], a, b, need[0], need[1])


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
    if need[0]:
        ga = g @ bp.T
        if alpha != 1.0:
            ga = ga * t(alpha)
        if transA:
            ga = ga.T
    if need[1]:
        gb = ap.T @ g
        if alpha != 1.0:
            gb = gb * t(alpha)
        if transB:
            gb = gb.T
    if c is not None and len(need) > 2 and need[2]:
        gc = unbroadcast(g * t(beta) if beta != 1.0 else g, c.shape)
    return ga, gb, gc
