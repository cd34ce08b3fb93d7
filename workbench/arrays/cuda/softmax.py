"""CUDA Softmax / LogSoftmax along the last axis (one block per row, warp-shuffle reductions)
and softmax cross-entropy forward/backward for (N, C) scores with integer labels."""

from __future__ import annotations

import numpy as np

from workbench.arrays import cupy_module
from workbench.arrays.cuda import _base

FAMILY = "softmax"

SOURCE = _base.REDUCE + r"""
extern "C" __global__ void softmax_lastdim(const T* __restrict__ x, T* __restrict__ y,
        long long cols, int log_) {
    long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    float m = WB_NEG_INF;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, ld(xr[j]));
    m = block_max(m);
    float s = 0.f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(ld(xr[j]) - m);
    s = block_sum(s);
    if (log_) {
        float lse = m + logf(s);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = st(ld(xr[j]) - lse);
    } else {
        float inv = 1.f / s;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x)
            yr[j] = st(expf(ld(xr[j]) - m) * inv);
    }
}

// per row: loss = logsumexp(x) - x[label] (0 for ignore_index; NaN for a label out of range),
// valid = 1 unless ignored; optionally the log-probabilities
extern "C" __global__ void sce_fwd(const T* __restrict__ x, const long long* __restrict__ labels,
        float* __restrict__ loss, float* __restrict__ valid, T* __restrict__ logp,
        int C, long long ignore_index, int has_ignore, int want_logp) {
    long long row = blockIdx.x;
    const T* xr = x + row * (long long)C;
    float m = WB_NEG_INF;
    for (int j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, ld(xr[j]));
    m = block_max(m);
    float s = 0.f;
    for (int j = threadIdx.x; j < C; j += blockDim.x) s += expf(ld(xr[j]) - m);
    float lse = m + logf(block_sum(s));
    if (want_logp)
        for (int j = threadIdx.x; j < C; j += blockDim.x)
            logp[row * (long long)C + j] = st(ld(xr[j]) - lse);
    if (threadIdx.x == 0) {
        long long lab = labels[row];
        if (has_ignore && lab == ignore_index) { loss[row] = 0.f; valid[row] = 0.f; }
        else if (lab < 0 || lab >= C) { loss[row] = __int_as_float(0x7fc00000); valid[row] = 1.f; }
        else { loss[row] = lse - ld(xr[lab]); valid[row] = 1.f; }
    }
}

// dx[row, j] = (softmax(x)[j] - [j == label]) * scale[row]; 0 for ignored rows
extern "C" __global__ void sce_bwd(const T* __restrict__ x, const long long* __restrict__ labels,
        const float* __restrict__ scale, T* __restrict__ dx, int C, long long ignore_index,
        int has_ignore) {
    long long row = blockIdx.x;
    const T* xr = x + row * (long long)C;
    T* dr = dx + row * (long long)C;
    long long lab = labels[row];
    if (has_ignore && lab == ignore_index) {
        for (int j = threadIdx.x; j < C; j += blockDim.x) dr[j] = st(0.f);
        return;
    }
    float m = WB_NEG_INF;
    for (int j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, ld(xr[j]));
    m = block_max(m);
    float s = 0.f;
    for (int j = threadIdx.x; j < C; j += blockDim.x) s += expf(ld(xr[j]) - m);
    float inv = 1.f / block_sum(s);
    float g = scale[row];
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float p = expf(ld(xr[j]) - m) * inv;
        dr[j] = st((p - (j == lab ? 1.f : 0.f)) * g);
    }
}
"""


def _rows(x):
    cols = x.shape[-1]
    return (x.size // cols if cols else 0), cols


def softmax_lastdim(x, *, log=False):
    """Softmax (or LogSoftmax) of x along its last axis."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    y = cp.empty_like(x)
    rows, cols = _rows(x) if x.ndim else (0, 0)
    if rows and cols:
        fn = _base.function(FAMILY, SOURCE, "softmax_lastdim", x.dtype)
        fn((rows,), (_base.row_threads(cols),), (x, y, np.int64(cols), np.int32(bool(log))))
    return y


def softmax_cross_entropy(scores, labels, *, reduction="mean", ignore_index=None,
                          want_log_prob=False):
    """SoftmaxCrossEntropyLoss of (N, C) scores and (N,) int labels, no class weights.

    Returns the loss in ``scores.dtype`` (shape (N,) for 'none', () otherwise) and, with
    ``want_log_prob``, the log-probabilities. 'mean' divides by the number of rows not equal to
    ``ignore_index`` (on the device, no host sync)."""
    cp = cupy_module()
    x = cp.ascontiguousarray(scores)
    N, C = x.shape
    lab = cp.ascontiguousarray(labels, dtype=np.int64)
    loss = cp.empty((N,), dtype=np.float32)
    valid = cp.empty((N,), dtype=np.float32)
    logp = cp.empty_like(x) if want_log_prob else x
    if N:
        fn = _base.function(FAMILY, SOURCE, "sce_fwd", x.dtype)
        fn((N,), (_base.row_threads(C),),
           (x, lab, loss, valid, logp, np.int32(C),
            np.int64(0 if ignore_index is None else ignore_index),
            np.int32(ignore_index is not None), np.int32(bool(want_log_prob))))
    if reduction == "none":
        out = loss
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss.sum() / valid.sum()
    out = out.astype(x.dtype)
    return (out, logp) if want_log_prob else out


def softmax_cross_entropy_backward(scores, labels, dloss, *, reduction="mean",
                                   ignore_index=None):
    """d(loss)/d(scores) for :func:`softmax_cross_entropy` given the loss gradient ``dloss``
    (shape (N,) for 'none', () otherwise)."""
    cp = cupy_module()
    x = cp.ascontiguousarray(scores)
    N, C = x.shape
    lab = cp.ascontiguousarray(labels, dtype=np.int64)
    g = cp.asarray(dloss, dtype=np.float32)
    if reduction == "none":
        scale = cp.ascontiguousarray(g.reshape(N))
    elif reduction == "sum":
        scale = cp.broadcast_to(g.reshape(()), (N,)).copy()
    else:
        if ignore_index is None:
            count = np.float32(max(N, 1))
        else:
            count = (lab != ignore_index).sum().astype(np.float32)
        scale = cp.broadcast_to((g.reshape(()) / count), (N,)).copy()
    dx = cp.empty_like(x)
    if N:
        fn = _base.function(FAMILY, SOURCE, "sce_bwd", x.dtype)
        fn((N,), (_base.row_threads(C),),
           (x, lab, scale, dx, np.int32(C),
            np.int64(0 if ignore_index is None else ignore_index),
            np.int32(ignore_index is not None)))
    return dx
