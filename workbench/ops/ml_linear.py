"""ai.onnx.ml linear and kernel models: LinearClassifier, LinearRegressor, SVMClassifier,
SVMRegressor (opset 1).

Scores are computed in float64 on the host and returned as float32 (the spec's output type);
labels are int64 or string tensors. The two-class conventions (one stored score column turned
into two, the label threshold) follow onnxruntime, which is what converters target.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import InputError, ShapeError
from workbench.ops.ml_common import (
    apply_post_transform,
    argmax_labels,
    binary_label_and_scores,
    features_2d,
    labels_of,
    like_input,
    logistic,
    probit,
    pt_name,
)
from workbench.ops.registry import kernel

ML = "ai.onnx.ml"


def _memo(ctx, key, build):
    """A value derived from the node's attributes, computed on the node's first run and kept
    in its context (attribute lists of big models are not re-converted on every run)."""
    if ctx is None:
        return build()
    cache = ctx.extra.setdefault("ml_memo", {})
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _floats(op, name, values, required=True):
    if values is None or (not isinstance(values, np.ndarray) and len(values) == 0):
        if required:
            raise InputError(f"{op}: attribute {name} is required")
        return None
    return np.asarray(values, dtype=np.float64).reshape(-1)


# --------------------------------------------------------------------------- linear models


@kernel("LinearRegressor", since=1, domain=ML, wants_ctx=True)
def linear_regressor(X, *, coefficients=None, intercepts=None, post_transform="NONE",
                     targets=1, ctx=None):
    """Y = X . coefficients^T + intercepts, one column per target, then the post-transform."""
    op = "LinearRegressor"
    x = features_2d(op, X)
    coef = _memo(ctx, "coef", lambda: _floats(op, "coefficients", coefficients))
    t = int(targets)
    if t < 1 or coef.size % t:
        raise InputError(f"{op}: {coef.size} coefficients do not split into {t} targets")
    w = coef.reshape(t, -1)
    if w.shape[1] != x.shape[1]:
        raise ShapeError(f"{op}: X has {x.shape[1]} features but the coefficients are for "
                         f"{w.shape[1]}")
    y = x @ w.T
    b = _floats(op, "intercepts", intercepts, required=False)
    if b is not None:
        if b.size not in (1, t):
            raise InputError(f"{op}: {b.size} intercepts for {t} targets")
        y = y + b
    pt = pt_name(op, post_transform)
    if pt != "NONE":
        y = apply_post_transform(y, pt)
    return like_input(y.astype(np.float32), X)


@kernel("LinearClassifier", since=1, domain=ML, wants_ctx=True)
def linear_classifier(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                      intercepts=None, multi_class=0, post_transform="NONE", ctx=None):
    """Scores X . coefficients^T + intercepts per class; the label is the best class (or, with
    one score column, labels[1] where the score is positive); Z post-transformed."""
    op = "LinearClassifier"
    x = features_2d(op, X)
    coef = _memo(ctx, "coef", lambda: _floats(op, "coefficients", coefficients))
    labels, _ = _memo(ctx, "labels",
                      lambda: labels_of(op, classlabels_ints, classlabels_strings))
    f = x.shape[1]
    if f == 0 or coef.size % f:
        raise ShapeError(f"{op}: {coef.size} coefficients do not split into rows of X's "
                         f"{f} features")
    w = coef.reshape(-1, f)
    c = w.shape[0]
    scores = x @ w.T
    b = _floats(op, "intercepts", intercepts, required=False)
    if b is not None:
        if b.size != c:
            raise InputError(f"{op}: {b.size} intercepts for {c} score columns")
        scores = scores + b
    pt = pt_name(op, post_transform)
    if c == 1:
        s = scores[:, 0]
        if len(labels) == 2:
            if pt != "PROBIT":  # onnxruntime: [1 - p, p]; the softmaxes of one column
                p = logistic(s) if pt == "LOGISTIC" else s  # leave it as it is
                y = np.where(s > 0, labels[1], labels[0])
                z = np.stack([1 - p, p], axis=1)
            else:
                y, z = binary_label_and_scores(s, pt, labels, 0.0, False)
        else:
            pos, neg = ((labels[0], labels[0]) if len(labels) == 1 else (1, 0))
            if labels.dtype == object and len(labels) != 1:
                pos, neg = "1", "0"
            y = np.where(s > 0, pos, neg)
            z = apply_post_transform(scores, pt)
    else:
        if c != len(labels):
            raise InputError(f"{op}: {c} score columns but {len(labels)} class labels")
        y = argmax_labels(scores, labels)
        z = apply_post_transform(scores, pt)
    y = np.asarray(y, dtype=labels.dtype)
    return like_input(y, X), like_input(z.astype(np.float32), X)


# --------------------------------------------------------------------------- SVMs


def _kernel_params(op, kernel_type, kernel_params):
    kt = kernel_type.decode() if isinstance(kernel_type, bytes) else str(kernel_type)
    if kt not in ("LINEAR", "POLY", "RBF", "SIGMOID"):
        raise InputError(f"{op}: kernel_type {kt!r} must be LINEAR, POLY, RBF or SIGMOID")
    p = list(kernel_params or [])
    gamma = p[0] if len(p) > 0 else 0.0
    coef0 = p[1] if len(p) > 1 else 0.0
    degree = p[2] if len(p) > 2 else 0.0
    return kt, gamma, coef0, degree


def _gram(x: np.ndarray, sv: np.ndarray, kt: str, gamma: float, coef0: float, degree: float):
    """K(x_n, sv_s) for every row and support vector: an [N, S] matrix."""
    if kt == "RBF":
        d = (x * x).sum(1)[:, None] + (sv * sv).sum(1)[None, :] - 2 * (x @ sv.T)
        return np.exp(-gamma * np.maximum(d, 0))
    dot = x @ sv.T
    if kt == "LINEAR":
        return dot
    if kt == "POLY":
        return np.power(gamma * dot + coef0, degree)
    return np.tanh(gamma * dot + coef0)


def _same_features(op, x, sv):
    if x.shape[1] != sv.shape[1]:
        raise ShapeError(f"{op}: X has {x.shape[1]} features, the support vectors "
                         f"{sv.shape[1]}")


def _support_vectors(op, support_vectors, n_sv, f):
    sv = _floats(op, "support_vectors", support_vectors)
    if n_sv == 0 or sv.size != n_sv * f:
        raise ShapeError(f"{op}: {sv.size} support-vector values are not {n_sv} vectors of "
                         f"X's {f} features")
    return sv.reshape(n_sv, f)


@kernel("SVMRegressor", since=1, domain=ML, wants_ctx=True)
def svm_regressor(X, *, coefficients=None, kernel_params=None, kernel_type="LINEAR",
                  n_supports=0, one_class=0, post_transform="NONE", rho=None,
                  support_vectors=None, ctx=None):
    """y = sum_s coefficients[s] K(x, sv_s) + rho (or the linear form without support
    vectors); one_class gives +1 / -1 by the sign."""
    op = "SVMRegressor"
    x = features_2d(op, X)
    kt, gamma, coef0, degree = _kernel_params(op, kernel_type, kernel_params)
    coef = _memo(ctx, "coef", lambda: _floats(op, "coefficients", coefficients))
    r = _floats(op, "rho", rho, required=False)
    r0 = float(r[0]) if r is not None and r.size else 0.0
    ns = int(n_supports)
    if ns > 0:
        sv = _memo(ctx, "sv", lambda: _support_vectors(op, support_vectors, ns, x.shape[1]))
        _same_features(op, x, sv)
        if coef.size != ns:
            raise InputError(f"{op}: {coef.size} coefficients for {ns} support vectors")
        y = _gram(x, sv, kt, gamma, coef0, degree) @ coef + r0
    else:
        if coef.size != x.shape[1]:
            raise ShapeError(f"{op}: X has {x.shape[1]} features but the linear form has "
                             f"{coef.size} coefficients")
        y = _gram(x, coef.reshape(1, -1), kt, gamma, coef0, degree)[:, 0] + r0
    if int(one_class):
        y = np.where(y > 0, 1.0, -1.0)
    y = y.reshape(-1, 1)
    pt = pt_name(op, post_transform)
    if pt != "NONE":
        y = apply_post_transform(y, pt)
    return like_input(y.astype(np.float32), X)


def _sigmoid_prob(d, a, b):
    v = d * a + b
    with np.errstate(over="ignore"):
        return np.where(v >= 0, np.exp(-np.abs(v)) / (1 + np.exp(-np.abs(v))),
                        1 / (1 + np.exp(-np.abs(v))))


def _pairwise_coupling(r: np.ndarray) -> np.ndarray:
    """libsvm's multi-class probabilities from pairwise ones (Wu, Lin and Weng's second
    method), vectorised over rows: r is [N, k, k] with r[i, j] = P(i | i or j)."""
    n, k, _ = r.shape
    q = np.zeros((n, k, k))
    idx = np.arange(k)
    rt = np.swapaxes(r, 1, 2)
    q[:] = -rt * r
    diag = (rt * rt).sum(axis=2) - (rt * rt)[:, idx, idx]
    q[:, idx, idx] = diag
    p = np.full((n, k), 1.0 / k)
    active = np.ones(n, dtype=bool)
    eps = 0.005 / k
    for _ in range(max(100, k)):
        qp = np.einsum("nij,nj->ni", q, p)
        pqp = (p * qp).sum(1)
        err = np.abs(qp - pqp[:, None]).max(1)
        active &= ~(err < eps)
        if not active.any():
            break
        a = active
        for t in range(k):
            qtt = q[a, t, t]
            diff = (-qp[a, t] + pqp[a]) / qtt
            p[a, t] += diff
            denom = (1 + diff)
            pqp[a] = (pqp[a] + diff * (diff * qtt + 2 * qp[a, t])) / denom / denom
            p[a] /= denom[:, None]
            qp[a] = (qp[a] + diff[:, None] * q[a, :, t]) / denom[:, None]
    return p


@kernel("SVMClassifier", since=1, domain=ML, wants_ctx=True)
def svm_classifier(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                   kernel_params=None, kernel_type="LINEAR", post_transform="NONE",
                   prob_a=None, prob_b=None, rho=None, support_vectors=None,
                   vectors_per_class=None, ctx=None):
    """One-vs-one SVC (support vectors grouped per class, libsvm's layout: votes decide the
    label; prob_a/prob_b give Platt-scaled pairwise probabilities coupled into class
    probabilities) or, without vectors_per_class, one linear/kernel score per class."""
    op = "SVMClassifier"
    x = features_2d(op, X)
    kt, gamma, coef0, degree = _kernel_params(op, kernel_type, kernel_params)
    labels, _ = _memo(ctx, "labels",
                      lambda: labels_of(op, classlabels_ints, classlabels_strings))
    coef = _memo(ctx, "coef", lambda: _floats(op, "coefficients", coefficients))
    r = _floats(op, "rho", rho, required=False)
    r = np.zeros(1) if r is None else r
    pt = pt_name(op, post_transform)
    n = x.shape[0]
    vpc = [int(v) for v in (vectors_per_class or [])]
    pa = _floats(op, "prob_a", prob_a, required=False)
    pb = _floats(op, "prob_b", prob_b, required=False)
    k = len(labels)
    if not vpc:
        # no support vectors: a linear SVM, one weight row per class; onnxruntime computes
        # x . w_c + rho[0] whatever kernel_type says (a linear model has no kernel)
        f = x.shape[1]
        if coef.size % max(f, 1):
            raise ShapeError(f"{op}: {coef.size} coefficients are not rows of X's {f} "
                             f"features")
        w = coef.reshape(-1, f)
        scores = x @ w.T + r[0]
        if w.shape[0] == 1 and k == 2:
            y, z = binary_label_and_scores(scores[:, 0], pt, labels, 0.0, False)
            return like_input(np.asarray(y, dtype=labels.dtype), X), \
                like_input(z.astype(np.float32), X)
        y = argmax_labels(scores, labels)
        z = apply_post_transform(scores, pt)
        return like_input(y, X), like_input(z.astype(np.float32), X)

    if len(vpc) != k:
        raise InputError(f"{op}: vectors_per_class has {len(vpc)} entries for {k} classes")
    n_sv = sum(vpc)
    sv = _memo(ctx, "sv", lambda: _support_vectors(op, support_vectors, n_sv, x.shape[1]))
    _same_features(op, x, sv)
    if coef.size != (k - 1) * n_sv:
        raise InputError(f"{op}: {coef.size} coefficients, expected (classes - 1) x support "
                         f"vectors = {(k - 1) * n_sv}")
    c = coef.reshape(k - 1, n_sv)
    starts = np.concatenate([[0], np.cumsum(vpc)])
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    if r.size < len(pairs):
        raise InputError(f"{op}: {r.size} rho values for {len(pairs)} class pairs")
    def pair_weights():
        w = np.zeros((n_sv, len(pairs)))
        for p, (i, j) in enumerate(pairs):
            si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
            w[si, p] = c[j - 1, si]
            w[sj, p] = c[i, sj]
        return w

    wmat = _memo(ctx, "wmat", pair_weights)
    dec = _gram(x, sv, kt, gamma, coef0, degree) @ wmat + r[: len(pairs)]
    votes = np.zeros((n, k), dtype=np.int64)
    for p, (i, j) in enumerate(pairs):
        win = dec[:, p] > 0
        votes[:, i] += win
        votes[:, j] += ~win
    if pa is not None and pa.size:
        if pb is None or pb.size != pa.size or pa.size < len(pairs):
            raise InputError(f"{op}: prob_a and prob_b need one value per class pair "
                             f"({len(pairs)})")
        rr = np.zeros((n, k, k))
        for p, (i, j) in enumerate(pairs):
            v = np.clip(_sigmoid_prob(dec[:, p], pa[p], pb[p]), 1e-7, 1 - 1e-7)
            rr[:, i, j] = v
            rr[:, j, i] = 1 - v
        # coupled for two classes too (as onnxruntime does: libsvm itself takes the pairwise
        # probability directly there; the two differ by the iteration's tolerance)
        probs = _pairwise_coupling(rr)
        # the label comes from the votes, as scikit-learn's predict and onnxruntime do
        y = labels[np.argmax(votes, axis=1)]
        if pt == "PROBIT":
            probs = probit(probs)
        elif pt != "NONE":
            probs = apply_post_transform(probs, pt)
        return like_input(y, X), like_input(probs.astype(np.float32), X)
    y = labels[np.argmax(votes, axis=1)]
    if k == 2:
        s = dec[:, 0]
        # libsvm's sign: a positive decision votes for the first class
        y = np.where(s > 0, labels[0], labels[1]).astype(labels.dtype)
        # the two score columns as onnxruntime writes them
        if pt == "LOGISTIC":
            z = np.stack([logistic(-s), logistic(s)], axis=1)
        elif pt in ("SOFTMAX", "SOFTMAX_ZERO"):
            z = np.stack([1 - s, s], axis=1)
        elif pt == "PROBIT":
            z = np.stack([probit(s), np.zeros_like(s)], axis=1)
        else:
            z = np.stack([-s, s], axis=1)
        return like_input(y, X), like_input(z.astype(np.float32), X)
    z = apply_post_transform(dec, pt) if pt != "NONE" else dec
    return like_input(y, X), like_input(z.astype(np.float32), X)
