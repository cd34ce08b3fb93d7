"""CUDA 2-D pooling: MaxPool / AveragePool forward and their backward functions
(``maxpool2d_backward``, ``avgpool2d_backward``) for the autograd rules.

Backward kernels gather (one thread per input pixel, visiting the windows that contain it), so
they need no atomics and are deterministic. Window geometry: window (oh, ow) starts at
``oh*sh - ph`` and has taps every ``dh``; ``pads_end`` only matters for AveragePool's
``count_include_pad`` divisor (taps inside [-ph, H + pe_h) count; taps beyond that, which only
``ceil_mode`` creates, do not).
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import cupy_module
from workbench.arrays.cuda import _base
from workbench.arrays.geometry import window_geometry
from workbench.errors import WorkbenchError

FAMILY = "pool"

SOURCE = _base.WINDOW_OF + r"""
// one thread per output element; argmax (flat ih*W+iw inside the plane) when want_idx
extern "C" __global__ void maxpool2d_fwd(const T* __restrict__ x, T* __restrict__ y,
        int* __restrict__ argmax, int H, int W, int OH, int OW, int KH, int KW,
        int ph, int pw, int sh, int sw, int dh, int dw, int want_idx, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int ow = (int)(idx % OW); long long t = idx / OW;
        int oh = (int)(t % OH); long long p = t / OH;
        const T* xp = x + p * (long long)H * W;
        float m = WB_NEG_INF;
        int best = -1;
        for (int kh = 0; kh < KH; ++kh) {
            int ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int iw = ow * sw - pw + kw * dw;
                if (iw < 0 || iw >= W) continue;
                float v = ld(xp[ih * W + iw]);
                if (best < 0 || v > m || (v != v && m == m)) { m = v; best = ih * W + iw; }
            }
        }
        y[idx] = st(m);
        if (want_idx) argmax[idx] = best;
    }
}

// dx[p, h, w] = sum of dy over the windows whose argmax is (h, w)
extern "C" __global__ void maxpool2d_bwd(const T* __restrict__ dy, const int* __restrict__ argmax,
        T* __restrict__ dx, int H, int W, int OH, int OW, int KH, int KW,
        int ph, int pw, int sh, int sw, int dh, int dw, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int w = (int)(idx % W); long long t = idx / W;
        int h = (int)(t % H); long long p = t / H;
        int me = h * W + w;
        const T* dyp = dy + p * (long long)OH * OW;
        const int* ap = argmax + p * (long long)OH * OW;
        float acc = 0.f;
        for (int kh = 0; kh < KH; ++kh) {
            int oh = window_of(h, ph, kh, dh, sh, OH);
            if (oh < 0) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int ow = window_of(w, pw, kw, dw, sw, OW);
                if (ow < 0) continue;
                if (ap[oh * OW + ow] == me) acc += ld(dyp[oh * OW + ow]);
            }
        }
        dx[idx] = st(acc);
    }
}

// number of taps of window o along one axis: inside the image, or inside the padded extent
__device__ __forceinline__ int taps(int o, int s, int p, int k, int d, int n, int pe, int incl) {
    int lo = incl ? -p : 0, hi = incl ? n + pe : n, c = 0;
    for (int j = 0; j < k; ++j) { int i = o * s - p + j * d; if (i >= lo && i < hi) ++c; }
    return c;
}

extern "C" __global__ void avgpool2d_fwd(const T* __restrict__ x, T* __restrict__ y,
        int H, int W, int OH, int OW, int KH, int KW, int ph, int pw, int peh, int pew,
        int sh, int sw, int dh, int dw, int include_pad, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int ow = (int)(idx % OW); long long t = idx / OW;
        int oh = (int)(t % OH); long long p = t / OH;
        const T* xp = x + p * (long long)H * W;
        float acc = 0.f;
        for (int kh = 0; kh < KH; ++kh) {
            int ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int iw = ow * sw - pw + kw * dw;
                if (iw < 0 || iw >= W) continue;
                acc += ld(xp[ih * W + iw]);
            }
        }
        int cnt = taps(oh, sh, ph, KH, dh, H, peh, include_pad) *
                  taps(ow, sw, pw, KW, dw, W, pew, include_pad);
        y[idx] = st(acc / (float)(cnt > 0 ? cnt : 1));
    }
}

extern "C" __global__ void avgpool2d_bwd(const T* __restrict__ dy, T* __restrict__ dx,
        int H, int W, int OH, int OW, int KH, int KW, int ph, int pw, int peh, int pew,
        int sh, int sw, int dh, int dw, int include_pad, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int w = (int)(idx % W); long long t = idx / W;
        int h = (int)(t % H); long long p = t / H;
        const T* dyp = dy + p * (long long)OH * OW;
        float acc = 0.f;
        for (int kh = 0; kh < KH; ++kh) {
            int oh = window_of(h, ph, kh, dh, sh, OH);
            if (oh < 0) continue;
            int ch = taps(oh, sh, ph, KH, dh, H, peh, include_pad);
            for (int kw = 0; kw < KW; ++kw) {
                int ow = window_of(w, pw, kw, dw, sw, OW);
                if (ow < 0) continue;
                int cnt = ch * taps(ow, sw, pw, KW, dw, W, pew, include_pad);
                acc += ld(dyp[oh * OW + ow]) / (float)(cnt > 0 ? cnt : 1);
            }
        }
        dx[idx] = st(acc);
    }
}
"""


def pool_geometry(in_hw, ks, strides, dilations, pads, auto_pad, ceil_mode):
    """(pads_begin, pads_end, out_hw) of a 2-D pool (``arrays.geometry``, ONNX rules: in ceil
    mode the last window must start inside the image or its begin padding); None when the
    portable kernel must handle it (it raises the error)."""
    try:
        pb, pe, out, _ = window_geometry("Pool", in_hw, ks, strides, dilations, pads, auto_pad,
                                         ceil_mode=bool(ceil_mode))
    except WorkbenchError:
        return None
    return pb, pe, out


def _args(H, W, OH, OW, ks, pb, st, dl):
    return (np.int32(H), np.int32(W), np.int32(OH), np.int32(OW), np.int32(ks[0]),
            np.int32(ks[1]), np.int32(pb[0]), np.int32(pb[1]))


def maxpool2d(x, ks, strides, pads_begin, dilations, out_hw, *, return_argmax=False):
    """Max over each window of (N, C, H, W) x; with ``return_argmax`` also the int32 flat
    index (ih * W + iw) of each maximum inside its plane, for :func:`maxpool2d_backward`."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C, H, W = x.shape
    OH, OW = out_hw
    y = cp.empty((N, C, OH, OW), dtype=x.dtype)
    am = cp.empty((N, C, OH, OW), dtype=np.int32) if return_argmax else y
    if y.size:
        fn = _base.function(FAMILY, SOURCE, "maxpool2d_fwd", x.dtype)
        g, b = _base.grid(y.size)
        fn(g, b, (x, y, am) + _args(H, W, OH, OW, ks, pads_begin, strides, dilations) +
           (np.int32(strides[0]), np.int32(strides[1]), np.int32(dilations[0]),
            np.int32(dilations[1]), np.int32(bool(return_argmax)), np.int64(y.size)))
    return (y, am) if return_argmax else y


def maxpool2d_backward(dy, argmax, x_shape, ks, strides, pads_begin, dilations):
    """dL/dx of :func:`maxpool2d` from dy and the argmax it returned."""
    cp = cupy_module()
    dy = cp.ascontiguousarray(dy)
    N, C, H, W = x_shape
    OH, OW = dy.shape[2:]
    dx = cp.empty((N, C, H, W), dtype=dy.dtype)
    if dx.size:
        fn = _base.function(FAMILY, SOURCE, "maxpool2d_bwd", dy.dtype)
        g, b = _base.grid(dx.size)
        fn(g, b, (dy, cp.ascontiguousarray(argmax, dtype=np.int32), dx) +
           _args(H, W, OH, OW, ks, pads_begin, strides, dilations) +
           (np.int32(strides[0]), np.int32(strides[1]), np.int32(dilations[0]),
            np.int32(dilations[1]), np.int64(dx.size)))
    return dx


def _avg_args(H, W, OH, OW, ks, pb, pe, st, dl, include_pad, total):
    return (np.int32(H), np.int32(W), np.int32(OH), np.int32(OW), np.int32(ks[0]),
            np.int32(ks[1]), np.int32(pb[0]), np.int32(pb[1]), np.int32(pe[0]),
            np.int32(pe[1]), np.int32(st[0]), np.int32(st[1]), np.int32(dl[0]),
            np.int32(dl[1]), np.int32(bool(include_pad)), np.int64(total))


def avgpool2d(x, ks, strides, pads_begin, pads_end, dilations, out_hw, *,
              count_include_pad=False):
    """Average over each window of (N, C, H, W) x."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C, H, W = x.shape
    OH, OW = out_hw
    y = cp.empty((N, C, OH, OW), dtype=x.dtype)
    if y.size:
        fn = _base.function(FAMILY, SOURCE, "avgpool2d_fwd", x.dtype)
        g, b = _base.grid(y.size)
        fn(g, b, (x, y) + _avg_args(H, W, OH, OW, ks, pads_begin, pads_end, strides,
                                    dilations, count_include_pad, y.size))
    return y


def avgpool2d_backward(dy, x_shape, ks, strides, pads_begin, pads_end, dilations, *,
                       count_include_pad=False):
    """dL/dx of :func:`avgpool2d`."""
    cp = cupy_module()
    dy = cp.ascontiguousarray(dy)
    N, C, H, W = x_shape
    OH, OW = dy.shape[2:]
    dx = cp.empty((N, C, H, W), dtype=dy.dtype)
    if dx.size:
        fn = _base.function(FAMILY, SOURCE, "avgpool2d_bwd", dy.dtype)
        g, b = _base.grid(dx.size)
        fn(g, b, (dy, dx) + _avg_args(H, W, OH, OW, ks, pads_begin, pads_end, strides,
                                      dilations, count_include_pad, dx.size))
    return dx
