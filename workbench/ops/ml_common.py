"""Shared pieces of the ai.onnx.ml model kernels (linear, SVM, tree ensembles).

Not an op family (no kernels here): score post-transforms, the binary-classifier convention
onnxruntime follows when a two-class model stores a single score column, label tensors, and
host/device conversion (these kernels compute on the host in float64 and hand back arrays of
the input's array module).
"""

from __future__ import annotations

import math

import numpy as np

from workbench.errors import InputError
from workbench.ops._common import softmax as softmax_core

POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def host(x) -> np.ndarray:
    """A numpy view/copy of an array that may live on the GPU."""
    return np.asarray(x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x)


def like_input(out: np.ndarray, X):
    """``out`` (numpy) as an array of ``X``'s array module (cupy stays cupy); strings stay
    on the host."""
    if isinstance(X, np.ndarray) or out.dtype == object:
        return out
    from workbench.arrays import xp_of
    return xp_of(X).asarray(out)


def features_2d(op: str, X) -> np.ndarray:
    """X as a float64 [N, F] matrix: 1-D inputs are one row (onnxruntime's reading)."""
    x = host(X)
    if x.dtype == object or x.dtype.kind in "USb":
        raise InputError(f"{op}: X must be a numeric tensor (float, double, int32, int64), "
                         f"got {x.dtype}")
    if x.ndim == 0:
        x = x.reshape(1, 1)
    elif x.ndim == 1:
        x = x.reshape(1, -1)
    elif x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    return x.astype(np.float64)


def pt_name(op: str, post_transform) -> str:
    """The post-transform as its name; TreeEnsemble (opset 5) gives it as an int 0..4."""
    if isinstance(post_transform, (int, np.integer)):
        if not 0 <= int(post_transform) < len(POST_TRANSFORMS):
            raise InputError(f"{op}: post_transform {post_transform} must be 0..4 "
                             f"({', '.join(POST_TRANSFORMS)})")
        return POST_TRANSFORMS[int(post_transform)]
    name = post_transform.decode() if isinstance(post_transform, bytes) else str(post_transform)
    if name not in POST_TRANSFORMS:
        raise InputError(f"{op}: unknown post_transform {name!r}; expected one of "
                         f"{', '.join(POST_TRANSFORMS)}")
    return name


def _erfinv(y: np.ndarray) -> np.ndarray:
    """erfinv by Winitzki's closed form refined with three Newton steps (float64 accurate)."""
    y = np.clip(np.asarray(y, dtype=np.float64), -1 + 1e-16, 1 - 1e-16)
    a = 0.147
    ln = np.log(1 - y * y)
    t = 2 / (math.pi * a) + ln / 2
    z = np.sign(y) * np.sqrt(np.sqrt(t * t - ln / a) - t)
    from workbench.ops.elementwise import erf_array as erf  # noqa: PLC0415 - no scipy
    for _ in range(3):
        z = z - (erf(z) - y) / (2 / math.sqrt(math.pi) * np.exp(-z * z))
    return z


def probit(p: np.ndarray) -> np.ndarray:
    """The inverse of the standard normal CDF: sqrt(2) * erfinv(2p - 1)."""
    return math.sqrt(2) * _erfinv(2 * np.asarray(p, dtype=np.float64) - 1)


def logistic(s: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-s))


def softmax(s: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a [N, C] score matrix (the engine's one softmax)."""
    return softmax_core(np, s, 1, dtype=s.dtype if s.dtype.kind == "f" else np.float64)


def softmax_zero(s: np.ndarray) -> np.ndarray:
    """Softmax over the non-zero entries of each row; zeros stay zero."""
    nz = s != 0
    m = np.where(nz, s, -np.inf).max(axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.where(nz, np.exp(s - m), 0.0)
    tot = e.sum(axis=1, keepdims=True)
    return np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0.0)


def apply_post_transform(scores: np.ndarray, name: str) -> np.ndarray:
    """Post-transform a [N, C] score matrix (row-wise for the softmaxes)."""
    if name == "NONE":
        return scores
    if name == "LOGISTIC":
        return logistic(scores)
    if name == "SOFTMAX":
        return softmax(scores)
    if name == "SOFTMAX_ZERO":
        return softmax_zero(scores)
    return probit(scores)


def labels_of(op: str, ints, strings, n_expected: int | None = None):
    """(labels array, is_string) from the classlabels_* attributes (exactly one set)."""
    if ints is not None and strings is not None and len(ints) and len(strings):
        raise InputError(f"{op}: both integer and string class labels are set; exactly one "
                         f"must be")
    if strings is not None and len(strings):
        lab = np.empty(len(strings), dtype=object)
        lab[:] = [s.decode() if isinstance(s, bytes) else str(s) for s in strings]
        return lab, True
    if ints is not None and len(ints):
        return np.asarray(ints, dtype=np.int64), False
    raise InputError(f"{op}: no class labels (classlabels_int64s/ints or classlabels_strings)")


def binary_label_and_scores(s: np.ndarray, pt: str, labels: np.ndarray, threshold: float,
                            complement: bool):
    """A two-class model that stores one score column ``s`` (the positive class).

    The label is ``labels[1]`` where ``s > threshold``, else ``labels[0]``. The two score
    columns follow onnxruntime: with ``complement`` (probabilities: all weights positive) they
    are ``[1 - s, s]``; otherwise (margins) ``[-s, s]``, or ``[logistic(-s), logistic(s)]``
    under LOGISTIC; PROBIT maps the one score and leaves the other column zero."""
    y = np.where(s > threshold, labels[1] if len(labels) > 1 else 1, labels[0])
    if labels.dtype == object:
        y = y.astype(object)
    if pt == "PROBIT":
        z = np.stack([probit(s), np.zeros_like(s)], axis=1)
    elif complement:
        z = np.stack([1 - s, s], axis=1)
    elif pt == "LOGISTIC":
        z = np.stack([logistic(-s), logistic(s)], axis=1)
    else:
        z = np.stack([-s, s], axis=1)
    return y, z


def argmax_labels(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    if scores.shape[1] == 0:
        raise InputError("no class scores to choose a label from")
    idx = np.argmax(scores, axis=1)
    if idx.size and int(idx.max()) >= len(labels):
        raise InputError(f"a class index {int(idx.max())} has no label ({len(labels)} labels)")
    return labels[idx]


def string_array(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out
