"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12+).

Both take scores/log-probabilities of shape (N, C) or (N, C, d1, ..., dk) and integer labels of
shape (N) or (N, d1, ..., dk). Labels equal to ``ignore_index`` contribute no loss and no weight.
Reductions: ``none`` (per-sample loss), ``sum``, and ``mean`` = sum(loss) / sum(applied weights)
(the count of non-ignored labels when no weights are given).
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.ops._common import widen_half
from workbench.ops.registry import kernel

_REDUCTIONS = ("none", "sum", "mean")
#: up to this many labels are range-checked as a Python list: a training step's batch of labels
#: (two numpy reductions on a few elements cost ~10x the list's min and max)
_SMALL_LABELS = 256


def label_range(labels) -> tuple[int, int]:
    """(smallest, largest) of a non-empty integer array, as Python ints."""
    if type(labels) is np.ndarray and labels.size <= _SMALL_LABELS:
        values = labels.ravel().tolist()
        return min(values), max(values)
    return int(labels.min()), int(labels.max())


def _nll(op, log_prob, labels, weights, reduction, ignore_index):
    """Weighted negative log-likelihood in the working precision of ``log_prob``."""
    xp = xp_of(log_prob)
    if reduction not in _REDUCTIONS:
        raise InputError(f"{op}: reduction {reduction!r} is not supported (none, sum, mean)")
    if log_prob.ndim < 2:
        raise ShapeError(f"{op}: input must be (N, C) or (N, C, d1, ..., dk), got shape "
                         f"{tuple(log_prob.shape)}")
    n, c = log_prob.shape[:2]
    expect = (n,) + tuple(log_prob.shape[2:])
    if tuple(labels.shape) != expect:
        raise ShapeError(f"{op}: labels shape {tuple(labels.shape)} must be {expect} for input "
                         f"shape {tuple(log_prob.shape)}")
    lab = labels.astype(np.int64, copy=False)
    keep = None if ignore_index is None else lab != int(ignore_index)
    safe = lab if keep is None else xp.where(keep, lab, 0)
    if safe.size:
        lo, hi = label_range(safe)
        if lo < 0 or hi >= c:
            raise InputError(f"{op}: label {lo if lo < 0 else hi} is out of range [0, {c}) "
                             f"(and is not ignore_index={ignore_index})")
    if log_prob.ndim == 2:   # the same elements as take_along_axis, without its index arrays
        picked = log_prob[xp.arange(n), safe]
    else:
        picked = xp.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    if weights is not None:
        if tuple(weights.shape) != (c,):
            raise ShapeError(f"{op}: weights must have shape ({c},), got "
                             f"{tuple(weights.shape)}")
        w = xp.take(widen_half(weights), safe)
        if keep is not None:
            w = xp.where(keep, w, xp.zeros((), dtype=w.dtype))
    elif keep is not None:
        w = keep.astype(picked.dtype)
    else:
        w = None
    loss = -picked if w is None else -picked * w
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    denom = w.sum() if w is not None else picked.dtype.type(loss.size)
    return total / denom


def _log_softmax(x, axis=1):
    xp = xp_of(x)
    m = x.max(axis=axis, keepdims=True) if x.size else x.sum(axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    z = x - m
    return z - xp.log(xp.exp(z).sum(axis=axis, keepdims=True))


@kernel("NegativeLogLikelihoodLoss", since=12, settings=(1, 2))
def negative_log_likelihood_loss(input, target, weight=None, *, reduction="mean",
                                 ignore_index=None):
    """``-input[n, target[n, ...], ...] * weight[target]``, then reduced."""
    xp = xp_of(input)
    out = _nll("NegativeLogLikelihoodLoss", widen_half(input), target, weight, reduction,
               ignore_index)
    return xp.asarray(out).astype(input.dtype, copy=False)


@kernel("SoftmaxCrossEntropyLoss", since=12, wants_ctx=True, settings=(1, 2))
def softmax_cross_entropy_loss(scores, labels, weights=None, *, reduction="mean",
                               ignore_index=None, ctx):
    """NegativeLogLikelihoodLoss of log_softmax(scores, axis=1); the optional second output is
    that log-probability tensor."""
    xp = xp_of(scores)
    if scores.ndim < 2:
        raise ShapeError(f"SoftmaxCrossEntropyLoss: scores must be (N, C) or (N, C, d1, ..., dk),"
                         f" got shape {tuple(scores.shape)}")
    log_prob = _log_softmax(widen_half(scores), axis=1)
    out = _nll("SoftmaxCrossEntropyLoss", log_prob, labels, weights, reduction, ignore_index)
    out = xp.asarray(out).astype(scores.dtype, copy=False)
    if ctx.n_outputs > 1:
        return out, log_prob.astype(scores.dtype, copy=False)
    return out
