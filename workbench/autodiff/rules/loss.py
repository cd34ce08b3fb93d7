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


def _plain_mean(x, labels, weights, ignore_index, reduction, g) -> bool:
    """Whether the loss is the plain mean over (N, C) float32/float64 scores of N >= 1 rows
    (N below 2**24: their count is exact in float32) with no class weights and no ignored
    label: what a training step's loss usually is."""
    return (reduction == "mean" and weights is None and ignore_index is None and x.ndim == 2
            and labels.ndim == 1 and x.dtype.char in "fd" and 0 < labels.shape[0] < (1 << 24)
            and g.size == 1)


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
    g = grads_out[0]
    if (g is not None and (len(grads_out) == 1 or grads_out[1] is None)
            and _plain_mean(x, labels, weights, ignore_index, reduction, g)):
        # the usual training loss, without the per-row weights of ones and the one-hot matrix:
        # the same operations on the same values, so the same bits as the general path below
        # (p - onehot is p with 1 taken off at each row's label; ones * q is q; adding the
        # zeros last keeps its one visible effect: a -0.0 product becomes +0.0)
        n = labels.shape[0]
        q = g.astype(x.dtype) / x.dtype.type(n)
        p[xp.arange(n), labels] -= 1
        p *= q
        p += 0
        return p, None, None
    gx = xp.zeros(x.shape, dtype=x.dtype)
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
