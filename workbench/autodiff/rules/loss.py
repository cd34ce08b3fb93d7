"""Gradients of SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (class weights,
ignore_index, reductions none/sum/mean, extra dimensions (N, C, d1, ...))."""

from __future__ import annotations

from workbench.autodiff.rules import gradient


def _per_element(xp, labels, weights, ignore_index, c, dtype):
    """(safe labels, per-element weight) with ignored elements weighted 0."""
    if ignore_index is not None:
        valid = labels != ignore_index
        safe = xp.where(valid, labels, 0)
    else:
        valid = None
        safe = labels
    w = weights[safe].astype(dtype) if weights is not None else xp.ones(labels.shape, dtype)
    if valid is not None:
        w = w * valid
    return safe, w


def _coef(xp, g, w, reduction):
    if reduction == "mean":
        den = w.sum()
        return w * (g / xp.where(den == 0, 1, den))
    if reduction == "sum":
        return w * g
    return w * g  # "none": g has the per-element shape


def _onehot(xp, safe, c, dtype):
    shape = (1, c) + (1,) * (safe.ndim - 1)
    return (xp.arange(c).reshape(shape) == xp.expand_dims(safe, 1)).astype(dtype)


@gradient("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_grad(ctx, grads_out, inputs, outputs, *, reduction="mean",
                               ignore_index=None, **attrs):
    xp = ctx.xp
    x, labels = inputs[0], inputs[1]
    weights = inputs[2] if len(inputs) > 2 else None
    c = x.shape[1]
    m = x.max(axis=1, keepdims=True)
    e = xp.exp(x - m)
    p = e / e.sum(axis=1, keepdims=True)
    gx = xp.zeros(x.shape, dtype=x.dtype)
    g = grads_out[0]
    if g is not None:
        safe, w = _per_element(xp, labels, weights, ignore_index, c, x.dtype)
        coef = _coef(xp, g.astype(x.dtype), w, reduction)
        gx = gx + (p - _onehot(xp, safe, c, x.dtype)) * xp.expand_dims(coef, 1)
    if len(grads_out) > 1 and grads_out[1] is not None:
        glp = grads_out[1]
        gx = gx + glp - p * glp.sum(axis=1, keepdims=True)
    return gx, None, None


@gradient("NegativeLogLikelihoodLoss")
def nll_loss_grad(ctx, grads_out, inputs, outputs, *, reduction="mean", ignore_index=None,
                  **attrs):
    xp = ctx.xp
    x, labels = inputs[0], inputs[1]
    weights = inputs[2] if len(inputs) > 2 else None
    c = x.shape[1]
    safe, w = _per_element(xp, labels, weights, ignore_index, c, x.dtype)
    coef = _coef(xp, grads_out[0].astype(x.dtype), w, reduction)
    gx = -_onehot(xp, safe, c, x.dtype) * xp.expand_dims(coef, 1)
    return gx, None, None
