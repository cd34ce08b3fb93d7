"""CUDA normalization: BatchNorm inference (optionally fused with ReLU), BatchNorm training
statistics (one block per channel, two passes in float32) and LayerNormalization over the
trailing axes (one block per row)."""

from __future__ import annotations

import numpy as np

from workbench.arrays import cupy_module
from workbench.arrays.cuda import _base

FAMILY = "norm"

SOURCE = _base.REDUCE + r"""
// y = x * a[c] + b[c] (a, b float32 per channel), optionally ReLU; x is (N, C, S) contiguous.
// 2-D grid: y walks the (n, c) planes, x the positions (32-bit index math per element)
extern "C" __global__ void bn_apply(const T* __restrict__ x, const float* __restrict__ a,
        const float* __restrict__ b, T* __restrict__ y, int N, int C, int S, int relu) {
    for (int r = blockIdx.y; r < N * C; r += gridDim.y) {
        int c = r % C;
        float ac = a[c], bc = b[c];
        long long base = (long long)r * S;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < S; i += blockDim.x * gridDim.x) {
            float v = ld(x[base + i]) * ac + bc;
            if (relu) v = fmaxf(v, 0.f);
            y[base + i] = st(v);
        }
    }
}

// per-channel mean and biased variance of x (N, C, S): one block per channel
extern "C" __global__ void bn_stats(const T* __restrict__ x, float* __restrict__ mean,
        float* __restrict__ var, int N, int C, int S) {
    int c = blockIdx.x;
    long long count = (long long)N * S;
    float s = 0.f;
    for (int n = 0; n < N; ++n) {
        const T* xc = x + ((long long)n * C + c) * S;
        for (int i = threadIdx.x; i < S; i += blockDim.x) s += ld(xc[i]);
    }
    float m = block_sum(s) / (float)(count > 0 ? count : 1);
    float q = 0.f;
    for (int n = 0; n < N; ++n) {
        const T* xc = x + ((long long)n * C + c) * S;
        for (int i = threadIdx.x; i < S; i += blockDim.x) {
            float d = ld(xc[i]) - m;
            q += d * d;
        }
    }
    float v = block_sum(q) / (float)(count > 0 ? count : 1);
    if (threadIdx.x == 0) { mean[c] = m; var[c] = v; }
}

// training BatchNorm backward, reductions: per channel sum(g) and sum(g * xhat),
// xhat = (x - mean[c]) * inv[c]; one block per channel
extern "C" __global__ void bn_bwd_reduce(const T* __restrict__ g, const T* __restrict__ x,
        const float* __restrict__ mean, const float* __restrict__ inv,
        float* __restrict__ sum_g, float* __restrict__ sum_gx, int N, int C, int S) {
    int c = blockIdx.x;
    float mc = mean[c], ic = inv[c];
    float sg = 0.f, sgx = 0.f;
    for (int n = 0; n < N; ++n) {
        long long base = ((long long)n * C + c) * S;
        for (int i = threadIdx.x; i < S; i += blockDim.x) {
            float gv = ld(g[base + i]);
            sg += gv;
            sgx += gv * (ld(x[base + i]) - mc) * ic;
        }
    }
    sg = block_sum(sg);
    sgx = block_sum(sgx);
    if (threadIdx.x == 0) { sum_g[c] = sg; sum_gx[c] = sgx; }
}

// dx = scale[c] * inv[c] / m * (m * g - sum_g[c] - xhat * sum_gx[c]); 2-D grid like bn_apply
extern "C" __global__ void bn_bwd_dx(const T* __restrict__ g, const T* __restrict__ x,
        const float* __restrict__ mean, const float* __restrict__ inv,
        const float* __restrict__ scale, const float* __restrict__ sum_g,
        const float* __restrict__ sum_gx, T* __restrict__ dx, int N, int C, int S, float m) {
    for (int r = blockIdx.y; r < N * C; r += gridDim.y) {
        int c = r % C;
        float mc = mean[c], ic = inv[c], k = scale[c] * ic / m, sg = sum_g[c], sgx = sum_gx[c];
        long long base = (long long)r * S;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < S; i += blockDim.x * gridDim.x) {
            float xh = (ld(x[base + i]) - mc) * ic;
            dx[base + i] = st(k * (m * ld(g[base + i]) - sg - xh * sgx));
        }
    }
}

// LayerNormalization of x (rows, cols) over cols; gamma/beta have cols elements
extern "C" __global__ void layernorm_fwd(const T* __restrict__ x, const T* __restrict__ gamma,
        const T* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean_out,
        float* __restrict__ rstd_out, long long cols, float eps, int has_beta, int want_stats) {
    long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    float s = 0.f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += ld(xr[j]);
    float m = block_sum(s) / (float)cols;
    float q = 0.f;
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
        float d = ld(xr[j]) - m;
        q += d * d;
    }
    float r = rsqrtf(block_sum(q) / (float)cols + eps);
    for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = (ld(xr[j]) - m) * r * ld(gamma[j]);
        if (has_beta) v += ld(beta[j]);
        yr[j] = st(v);
    }
    if (want_stats && threadIdx.x == 0) { mean_out[row] = m; rstd_out[row] = r; }
}
"""


def batchnorm_apply(x, a, b, *, relu=False):
    """y = x * a[c] + b[c] over channel axis 1 (a, b: per-channel float32), ReLU if asked."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C = x.shape[0], x.shape[1]
    S = int(np.prod(x.shape[2:], dtype=np.int64))
    y = cp.empty_like(x)
    if x.size:
        fn = _base.function(FAMILY, SOURCE, "bn_apply", x.dtype)
        g, blk = _base.grid2d(N * C, S)
        fn(g, blk, (x, cp.ascontiguousarray(a, dtype=np.float32),
                    cp.ascontiguousarray(b, dtype=np.float32), y, np.int32(N), np.int32(C),
                    np.int32(S), np.int32(bool(relu))))
    return y


def batchnorm_inference(x, scale, bias, mean, var, eps, *, relu=False):
    """Inference BatchNorm (+ ReLU): per-channel a = scale / sqrt(var + eps) folded on device."""
    cp = cupy_module()
    f = np.float32
    a = scale.astype(f) / cp.sqrt(var.astype(f) + f(eps))
    b = bias.astype(f) - mean.astype(f) * a
    return batchnorm_apply(x, a, b, relu=relu)


def batchnorm_stats(x):
    """(mean, biased variance) per channel of (N, C, ...) x, float32, one block per channel."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C = x.shape[:2]
    S = int(np.prod(x.shape[2:], dtype=np.int64))
    mean = cp.zeros((C,), dtype=np.float32)
    var = cp.zeros((C,), dtype=np.float32)
    if C and N * S:
        fn = _base.function(FAMILY, SOURCE, "bn_stats", x.dtype)
        t = _base.row_threads(N * S)
        fn((C,), (t,), (x, mean, var, np.int32(N), np.int32(C), np.int32(S)))
    return mean, var


def batchnorm_backward(g, x, mean, inv, scale, *, need_dx=True):
    """Training BatchNorm backward over channel axis 1: (dx or None, sum(g * xhat), sum(g))
    per channel (= dL/dscale, dL/dbias), with the batch ``mean`` and ``inv`` = 1/std
    (float32, shape (C,)) of the forward pass."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    g = cp.ascontiguousarray(g, dtype=x.dtype)
    N, C = x.shape[0], x.shape[1]
    S = int(np.prod(x.shape[2:], dtype=np.int64))
    f = np.float32
    mean = cp.ascontiguousarray(mean, dtype=f).reshape(-1)
    inv = cp.ascontiguousarray(inv, dtype=f).reshape(-1)
    sum_g = cp.zeros((C,), dtype=f)
    sum_gx = cp.zeros((C,), dtype=f)
    if C and N * S:
        fn = _base.function(FAMILY, SOURCE, "bn_bwd_reduce", x.dtype)
        fn((C,), (_base.row_threads(N * S),),
           (g, x, mean, inv, sum_g, sum_gx, np.int32(N), np.int32(C), np.int32(S)))
    dx = None
    if need_dx:
        dx = cp.empty_like(x)
        if x.size:
            fn = _base.function(FAMILY, SOURCE, "bn_bwd_dx", x.dtype)
            gr, blk = _base.grid2d(N * C, S)
            fn(gr, blk, (g, x, mean, inv, cp.ascontiguousarray(scale, dtype=f).reshape(-1),
                         sum_g, sum_gx, dx, np.int32(N), np.int32(C), np.int32(S),
                         f(N * S)))
    return dx, sum_gx, sum_g


def batchnorm_training(x, scale, bias, eps, *, relu=False):
    """Training BatchNorm: (y, batch mean, batch biased variance) with batch statistics."""
    cp = cupy_module()
    mean, var = batchnorm_stats(x)
    f = np.float32
    a = scale.astype(f) / cp.sqrt(var + f(eps))
    b = bias.astype(f) - mean * a
    return batchnorm_apply(x, a, b, relu=relu), mean, var


def layernorm(x, gamma, beta, axis, eps, *, want_stats=False):
    """LayerNormalization over axes [axis, ndim): y (x's dtype) and, with ``want_stats``,
    Mean and InvStdDev (float32, shape x.shape[:axis] + (1,) * (ndim - axis))."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    cols = int(np.prod(x.shape[axis:], dtype=np.int64))
    y = cp.empty_like(x)
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    mean = cp.empty(stat_shape, dtype=np.float32)
    rstd = cp.empty(stat_shape, dtype=np.float32)
    if rows and cols:
        fn = _base.function(FAMILY, SOURCE, "layernorm_fwd", x.dtype)
        g = cp.ascontiguousarray(gamma, dtype=x.dtype).reshape(-1)
        bb = g if beta is None else cp.ascontiguousarray(beta, dtype=x.dtype).reshape(-1)
        fn((rows,), (_base.row_threads(cols),),
           (x, g, bb, y, mean, rstd, np.int64(cols), np.float32(eps),
            np.int32(beta is not None), np.int32(bool(want_stats))))
    return (y, mean, rstd) if want_stats else y
