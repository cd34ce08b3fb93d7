"""CUDA convolution: im2col RawKernel + ``cupy.matmul`` (cuBLAS), col2im (gather form, no
atomics) for the data gradient and ConvTranspose, and a direct depthwise kernel.

Layouts are NCHW. ``cols`` is (N, C*KH*KW, OH*OW) - with groups the same memory reads as
(N, G, C/G*KH*KW, OH*OW), so one strided-batched GEMM covers every group and image.
Only 2-D convolutions are handled here; other ranks use the portable kernel.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import cupy_module
from workbench.arrays.cuda import _base

FAMILY = "conv"

SOURCE = r"""
// x: (N, C, H, W) -> cols: (N, C, KH, KW, OH, OW); zero outside the image (padding)
extern "C" __global__ void im2col_2d(const T* __restrict__ x, T* __restrict__ cols,
        int C, int H, int W, int KH, int KW, int OH, int OW,
        int ph, int pw, int sh, int sw, int dh, int dw, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int ow = (int)(idx % OW); long long t = idx / OW;
        int oh = (int)(t % OH); t /= OH;
        int kw = (int)(t % KW); t /= KW;
        int kh = (int)(t % KH); t /= KH;
        long long nc = t;                     // n * C + c
        int ih = oh * sh - ph + kh * dh;
        int iw = ow * sw - pw + kw * dw;
        T v = st(0.f);
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[(nc * H + ih) * W + iw];
        cols[idx] = v;
    }
}

// cols: (N, C, KH, KW, OH, OW) -> img: (N, C, H, W), summing every column entry that reads
// a pixel (the adjoint of im2col_2d). One thread per pixel: deterministic, no atomics.
extern "C" __global__ void col2im_2d(const T* __restrict__ cols, T* __restrict__ img,
        int C, int H, int W, int KH, int KW, int OH, int OW,
        int ph, int pw, int sh, int sw, int dh, int dw, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int w = (int)(idx % W); long long t = idx / W;
        int h = (int)(t % H); long long nc = t / H;
        float acc = 0.f;
        for (int kh = 0; kh < KH; ++kh) {
            int hs = h + ph - kh * dh;
            if (hs < 0 || hs % sh != 0) continue;
            int oh = hs / sh;
            if (oh >= OH) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int ws = w + pw - kw * dw;
                if (ws < 0 || ws % sw != 0) continue;
                int ow = ws / sw;
                if (ow >= OW) continue;
                acc += ld(cols[(((nc * KH + kh) * KW + kw) * OH + oh) * (long long)OW + ow]);
            }
        }
        img[idx] = st(acc);
    }
}

// depthwise: group == C, W: (M, 1, KH, KW) with M = C * mult; output channel m reads c = m / mult
extern "C" __global__ void depthwise_conv2d(const T* __restrict__ x, const T* __restrict__ w,
        const T* __restrict__ b, T* __restrict__ y,
        int C, int H, int W, int M, int mult, int KH, int KW, int OH, int OW,
        int ph, int pw, int sh, int sw, int dh, int dw, int has_bias, long long total) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        int ow = (int)(idx % OW); long long t = idx / OW;
        int oh = (int)(t % OH); t /= OH;
        int m = (int)(t % M); long long n = t / M;
        int c = m / mult;
        const T* xp = x + (n * C + c) * (long long)H * W;
        const T* wp = w + (long long)m * KH * KW;
        float acc = has_bias ? ld(b[m]) : 0.f;
        for (int kh = 0; kh < KH; ++kh) {
            int ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int iw = ow * sw - pw + kw * dw;
                if (iw < 0 || iw >= W) continue;
                acc += ld(xp[ih * W + iw]) * ld(wp[kh * KW + kw]);
            }
        }
        y[idx] = st(acc);
    }
}
"""

#: upper bound of the im2col buffer; larger batches are processed in chunks of images
COLS_BUDGET_BYTES = 512 << 20


# ----------------------------------------------------------------------------- geometry
def conv_geometry(in_hw, ks, strides, dilations, pads, auto_pad):
    """(pads_begin, pads_end, out_hw) of a 2-D convolution; None for an unknown auto_pad."""
    ap = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
    pb, pe, out = [], [], []
    for a, (n, k, s, d) in enumerate(zip(in_hw, ks, strides, dilations)):
        ek = (k - 1) * d + 1
        if ap in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + ek - n)
            small = total // 2
            b, e = (small, total - small) if ap == "SAME_UPPER" else (total - small, small)
        elif ap == "VALID":
            b = e = 0
            o = (n - ek) // s + 1
        elif ap == "NOTSET":
            p = list(pads) if pads is not None else [0] * (2 * len(in_hw))
            b, e = int(p[a]), int(p[a + len(in_hw)])
            o = (n + b + e - ek) // s + 1
        else:
            return None
        pb.append(b)
        pe.append(e)
        out.append(o)
    return pb, pe, out


def _pair(v, default):
    return [int(a) for a in v] if v is not None else [default, default]


def _launch_im2col(x, cols, C, H, W, KH, KW, OH, OW, pb, st, dl):
    fn = _base.function(FAMILY, SOURCE, "im2col_2d", x.dtype)
    total = cols.size
    g, b = _base.grid(total)
    fn(g, b, (x, cols, np.int32(C), np.int32(H), np.int32(W), np.int32(KH), np.int32(KW),
              np.int32(OH), np.int32(OW), np.int32(pb[0]), np.int32(pb[1]), np.int32(st[0]),
              np.int32(st[1]), np.int32(dl[0]), np.int32(dl[1]), np.int64(total)))


def col2im(cols, N, C, H, W, KH, KW, OH, OW, pb, st, dl):
    """Sum (N, C*KH*KW, OH*OW) columns back into an (N, C, H, W) image (im2col's adjoint)."""
    cp = cupy_module()
    cols = cp.ascontiguousarray(cols)
    img = cp.empty((N, C, H, W), dtype=cols.dtype)
    fn = _base.function(FAMILY, SOURCE, "col2im_2d", cols.dtype)
    total = img.size
    if total:
        g, b = _base.grid(total)
        fn(g, b, (cols, img, np.int32(C), np.int32(H), np.int32(W), np.int32(KH),
                  np.int32(KW), np.int32(OH), np.int32(OW), np.int32(pb[0]), np.int32(pb[1]),
                  np.int32(st[0]), np.int32(st[1]), np.int32(dl[0]), np.int32(dl[1]),
                  np.int64(total)))
    return img


def im2col(x, KH, KW, OH, OW, pb, st, dl):
    """(N, C, H, W) -> (N, C*KH*KW, OH*OW) columns (zero padding)."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C, H, W = x.shape
    cols = cp.empty((N, C * KH * KW, OH * OW), dtype=x.dtype)
    if cols.size:
        _launch_im2col(x, cols, C, H, W, KH, KW, OH, OW, pb, st, dl)
    return cols


# ----------------------------------------------------------------------------- forward
def conv2d(x, w, b=None, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1):
    """2-D convolution on cupy arrays (float32/float16): y = W * x + b, NCHW."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    w = cp.ascontiguousarray(w)
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    st, dl = list(strides), list(dilations)
    pb = [int(pads[0]), int(pads[1])]
    pe = [int(pads[2]), int(pads[3])]
    OH = (H + pb[0] + pe[0] - ((KH - 1) * dl[0] + 1)) // st[0] + 1
    OW = (W + pb[1] + pe[1] - ((KW - 1) * dl[1] + 1)) // st[1] + 1
    if N * M * max(OH, 0) * max(OW, 0) == 0:
        return cp.empty((N, M, max(OH, 0), max(OW, 0)), dtype=x.dtype)
    G = int(group)
    if G == C and Cg == 1 and M % C == 0 and G > 1:
        return _depthwise(x, w, b, cp.empty((N, M, OH, OW), dtype=x.dtype), pb, st, dl)
    K = Cg * KH * KW
    L = OH * OW
    w2 = w.reshape(G, M // G, K)
    pointwise = KH == KW == 1 and st == [1, 1] and pb == pe == [0, 0]
    per_image = C * KH * KW * L * x.itemsize
    chunk = N if pointwise else max(1, min(N, COLS_BUDGET_BYTES // max(per_image, 1)))
    cols = None if pointwise else cp.empty((chunk, C * KH * KW, L), dtype=x.dtype)
    y = cp.empty((N, M, OH, OW), dtype=x.dtype) if chunk < N else None
    yv = None if y is None else y.reshape(N, G, M // G, L)
    for n0 in range(0, N, chunk):
        n1 = min(N, n0 + chunk)
        if pointwise:
            c = x[n0:n1].reshape(n1 - n0, G, K, L)
        else:
            c = cols[:n1 - n0]
            _launch_im2col(x[n0:n1], c, C, H, W, KH, KW, OH, OW, pb, st, dl)
            c = c.reshape(n1 - n0, G, K, L)
        if n1 - n0 == N:        # one chunk: the GEMM's result is the output
            y = cp.matmul(w2, c).reshape(N, M, OH, OW)
        else:
            yv[n0:n1] = cp.matmul(w2, c)
    if b is not None:
        y += b.astype(y.dtype, copy=False).reshape(1, M, 1, 1)
    return y


def _depthwise(x, w, b, y, pb, st, dl):
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    _, _, OH, OW = y.shape
    fn = _base.function(FAMILY, SOURCE, "depthwise_conv2d", x.dtype)
    bb = w if b is None else cupy_module().ascontiguousarray(b.astype(x.dtype, copy=False))
    total = y.size
    g, blk = _base.grid(total)
    fn(g, blk, (x, w, bb, y, np.int32(C), np.int32(H), np.int32(W), np.int32(M),
                np.int32(M // C), np.int32(KH), np.int32(KW), np.int32(OH), np.int32(OW),
                np.int32(pb[0]), np.int32(pb[1]), np.int32(st[0]), np.int32(st[1]),
                np.int32(dl[0]), np.int32(dl[1]), np.int32(b is not None), np.int64(total)))
    return y


# ----------------------------------------------------------------------------- backward
def conv2d_backward_data(dy, w, x_shape, *, strides=(1, 1), pads=(0, 0, 0, 0),
                         dilations=(1, 1), group=1):
    """dL/dx of :func:`conv2d`: col2im(W^T @ dy) per group."""
    cp = cupy_module()
    N, C, H, W = x_shape
    M, Cg, KH, KW = w.shape
    G = int(group)
    _, _, OH, OW = dy.shape
    L = OH * OW
    K = Cg * KH * KW
    wt = cp.ascontiguousarray(w).reshape(G, M // G, K).transpose(0, 2, 1)     # (G, K, M/G)
    d = cp.ascontiguousarray(dy).reshape(N, G, M // G, L)
    cols = cp.matmul(wt, d)                                                   # (N, G, K, L)
    return col2im(cols.reshape(N, C * KH * KW, L), N, C, H, W, KH, KW, OH, OW,
                  [int(pads[0]), int(pads[1])], list(strides), list(dilations))


def conv2d_backward_weight(dy, x, w_shape, *, strides=(1, 1), pads=(0, 0, 0, 0),
                           dilations=(1, 1), group=1):
    """dL/dW of :func:`conv2d`: sum over images of dy @ cols^T, per group."""
    cp = cupy_module()
    N, C, H, W = x.shape
    M, Cg, KH, KW = w_shape
    G = int(group)
    _, _, OH, OW = dy.shape
    L = OH * OW
    K = Cg * KH * KW
    cols = im2col(x, KH, KW, OH, OW, [int(pads[0]), int(pads[1])], list(strides),
                  list(dilations)).reshape(N, G, K, L)
    d = cp.ascontiguousarray(dy).reshape(N, G, M // G, L)
    gw = cp.matmul(d, cols.transpose(0, 1, 3, 2)).sum(axis=0)                 # (G, M/G, K)
    return gw.reshape(M, Cg, KH, KW)


def conv_transpose2d(x, w, b=None, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
                     group=1, output_padding=(0, 0)):
    """2-D ConvTranspose (explicit pads): col2im(W^T @ x) + b; W is (C, M/G, KH, KW)."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C, H, W = x.shape
    _, Mg, KH, KW = w.shape
    G = int(group)
    M = Mg * G
    st, dl = list(strides), list(dilations)
    OH = (H - 1) * st[0] + (KH - 1) * dl[0] + 1 - pads[0] - pads[2] + output_padding[0]
    OW = (W - 1) * st[1] + (KW - 1) * dl[1] + 1 - pads[1] - pads[3] + output_padding[1]
    K = Mg * KH * KW
    wt = cp.ascontiguousarray(w).reshape(G, C // G, K).transpose(0, 2, 1)    # (G, K, C/G)
    cols = cp.matmul(wt, x.reshape(N, G, C // G, H * W))                      # (N, G, K, H*W)
    # the output image is what a conv with this geometry would read to produce (H, W)
    y = col2im(cols.reshape(N, M * KH * KW, H * W), N, M, OH, OW, KH, KW, H, W,
               [int(pads[0]), int(pads[1])], st, dl)
    if b is not None:
        y += b.astype(y.dtype, copy=False).reshape(1, M, 1, 1)
    return y
