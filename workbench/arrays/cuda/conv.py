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
from workbench.arrays.geometry import window_geometry
from workbench.errors import WorkbenchError

FAMILY = "conv"

SOURCE = _base.WINDOW_OF + r"""
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

// x: (N, C, H, W) -> K-major cols: (C, KH, KW, N, OH, OW), i.e. a (C*KH*KW, N*OH*OW) matrix:
// one GEMM W (M, K) @ cols covers every image (no batched small GEMMs). 2-D grid: y walks
// the rows (c, kh, kw, n), x the output pixels; all index math in 32-bit ints.
extern "C" __global__ void im2col_2d_k(const T* __restrict__ x, T* __restrict__ cols,
        int N, int C, int H, int W, int KH, int KW, int OH, int OW,
        int ph, int pw, int sh, int sw, int dh, int dw) {
    int L = OH * OW;
    int rows = C * KH * KW * N;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        int n = r % N; int t = r / N;
        int kw = t % KW; t /= KW;
        int kh = t % KH; int c = t / KH;
        const T* xc = x + ((long long)n * C + c) * H * W;
        T* out = cols + (long long)r * L;
        for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < L; p += blockDim.x * gridDim.x) {
            int oh = p / OW; int ow = p - oh * OW;
            int ih = oh * sh - ph + kh * dh;
            int iw = ow * sw - pw + kw * dw;
            out[p] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xc[ih * W + iw] : st(0.f);
        }
    }
}

// cols -> img (N, C, H, W), summing every column entry that reads a pixel: the adjoint of
// im2col_2d_k (kmajor: cols (C, KH, KW, N, OH, OW)) and of im2col_2d (cols (N, C, KH, KW, OH,
// OW)). 2-D grid: y walks the (n, c) planes, x the pixels; one thread per pixel, no atomics.
extern "C" __global__ void col2im_2d(const T* __restrict__ cols, T* __restrict__ img,
        int N, int C, int H, int W, int KH, int KW, int OH, int OW,
        int ph, int pw, int sh, int sw, int dh, int dw, int kmajor) {
    int L = OH * OW;
    int HW = H * W;
    for (int r = blockIdx.y; r < N * C; r += gridDim.y) {
        int c = r % C; int n = r / C;
        for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < HW; p += blockDim.x * gridDim.x) {
            int h = p / W; int w = p - h * W;
            float acc = 0.f;
            for (int kh = 0; kh < KH; ++kh) {
                int oh = window_of(h, ph, kh, dh, sh, OH);
                if (oh < 0) continue;
                for (int kw = 0; kw < KW; ++kw) {
                    int ow = window_of(w, pw, kw, dw, sw, OW);
                    if (ow < 0) continue;
                    long long row = kmajor ? ((long long)(c * KH + kh) * KW + kw) * N + n
                                           : (((long long)n * C + c) * KH + kh) * KW + kw;
                    acc += ld(cols[row * L + oh * OW + ow]);
                }
            }
            img[(long long)r * HW + p] = st(acc);
        }
    }
}

// y (N, M, L) = act(g + b[m] + z): g is the GEMM result, (M, N, L) when transposed (the
// K-major layout) else (N, M, L) (may alias y). act: 0 none, 1 Relu, 2 LeakyRelu(alpha),
// 3 Clip(alpha, beta), 4 Sigmoid, 5 HardSigmoid(alpha, beta), 6 Tanh.
// 2-D grid: y walks the (n, m) rows, x the positions.
extern "C" __global__ void conv_epilogue(const T* g, const T* __restrict__ b,
        const T* __restrict__ z, T* y, int N, int M, int L, int transposed, int has_b,
        int has_z, int act, float alpha, float beta) {
    for (int r = blockIdx.y; r < N * M; r += gridDim.y) {
        int m = r % M; int n = r / M;
        long long dst = (long long)r * L;
        long long src = transposed ? ((long long)m * N + n) * L : dst;
        float bias = has_b ? ld(b[m]) : 0.f;
        for (int l = blockIdx.x * blockDim.x + threadIdx.x; l < L; l += blockDim.x * gridDim.x) {
            float v = ld(g[src + l]) + bias;
            if (has_z) v += ld(z[dst + l]);
            if (act == 1) v = fmaxf(v, 0.f);
            else if (act == 2) v = v >= 0.f ? v : v * alpha;
            else if (act == 3) v = fminf(fmaxf(v, alpha), beta);
            else if (act == 4) v = 1.f / (1.f + expf(-v));
            else if (act == 5) v = fminf(fmaxf(v * alpha + beta, 0.f), 1.f);
            else if (act == 6) v = tanhf(v);
            y[dst + l] = st(v);
        }
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
    """(pads_begin, pads_end, out_hw) of a 2-D convolution (``arrays.geometry``); None when
    the portable kernel must handle it (an unknown auto_pad, a kernel larger than the input:
    it raises the error)."""
    try:
        pb, pe, out, _ = window_geometry("Conv", in_hw, ks, strides, dilations, pads, auto_pad)
    except WorkbenchError:
        return None
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


def col2im(cols, N, C, H, W, KH, KW, OH, OW, pb, st, dl, *, kmajor=False):
    """Sum columns back into an (N, C, H, W) image (im2col's adjoint): ``cols`` is
    (N, C*KH*KW, OH*OW), or K-major (C*KH*KW, N*OH*OW) with ``kmajor``."""
    cp = cupy_module()
    cols = cp.ascontiguousarray(cols)
    img = cp.empty((N, C, H, W), dtype=cols.dtype)
    fn = _base.function(FAMILY, SOURCE, "col2im_2d", cols.dtype)
    if img.size:
        g, b = _base.grid2d(N * C, H * W)
        fn(g, b, (cols, img, np.int32(N), np.int32(C), np.int32(H), np.int32(W), np.int32(KH),
                  np.int32(KW), np.int32(OH), np.int32(OW), np.int32(pb[0]), np.int32(pb[1]),
                  np.int32(st[0]), np.int32(st[1]), np.int32(dl[0]), np.int32(dl[1]),
                  np.int32(bool(kmajor))))
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
#: activations the convolution epilogue applies (FusedConv): name -> code in conv_epilogue
ACTIVATIONS = {"": 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "HardSigmoid": 5,
               "Tanh": 6}


def epilogue(g, y, b=None, z=None, *, transposed=False, activation="", alpha=0.0, beta=0.0):
    """``y = act(g + b + z)`` in one pass; ``g`` is (M, N, L) when ``transposed`` (the K-major
    GEMM result) else y's own layout (N, M, L) (``g`` may be ``y``: in place)."""
    N, M = y.shape[0], y.shape[1]
    L = y.size // max(1, N * M)
    fn = _base.function(FAMILY, SOURCE, "conv_epilogue", y.dtype)
    total = y.size
    if not total:
        return y
    cp = cupy_module()
    bb = cp.ascontiguousarray(b.astype(y.dtype, copy=False)) if b is not None else y
    zz = cp.ascontiguousarray(z.astype(y.dtype, copy=False)) if z is not None else y
    gr, blk = _base.grid2d(N * M, L)
    fn(gr, blk, (g, bb, zz, y, np.int32(N), np.int32(M), np.int32(L), np.int32(bool(transposed)),
                 np.int32(b is not None), np.int32(z is not None),
                 np.int32(ACTIVATIONS[activation]), np.float32(alpha), np.float32(beta)))
    return y


def _launch_im2col_k(x, cols, N, C, H, W, KH, KW, OH, OW, pb, st, dl):
    fn = _base.function(FAMILY, SOURCE, "im2col_2d_k", x.dtype)
    g, b = _base.grid2d(C * KH * KW * N, OH * OW)
    fn(g, b, (x, cols, np.int32(N), np.int32(C), np.int32(H), np.int32(W), np.int32(KH),
              np.int32(KW), np.int32(OH), np.int32(OW), np.int32(pb[0]), np.int32(pb[1]),
              np.int32(st[0]), np.int32(st[1]), np.int32(dl[0]), np.int32(dl[1])))


def im2col_k(x, KH, KW, OH, OW, pb, st, dl):
    """(N, C, H, W) -> K-major columns (C*KH*KW, N*OH*OW) (zero padding); a 1x1/stride-1
    unpadded convolution needs no gather (x itself, images moved behind channels)."""
    cp = cupy_module()
    x = cp.ascontiguousarray(x)
    N, C, H, W = x.shape
    if KH == KW == 1 and list(st) == [1, 1] and list(pb) == [0, 0] and (OH, OW) == (H, W):
        if N == 1:
            return x.reshape(C, H * W)
        return cp.ascontiguousarray(x.reshape(N, C, H * W).transpose(1, 0, 2)).reshape(
            C, N * H * W)
    cols = cp.empty((C * KH * KW, N * OH * OW), dtype=x.dtype)
    if cols.size:
        _launch_im2col_k(x, cols, N, C, H, W, KH, KW, OH, OW, pb, st, dl)
    return cols


def _to_mnl(dy):
    """(N, M, OH, OW) -> (M, N*OH*OW), the K-major layout of an output gradient."""
    cp = cupy_module()
    N, M = dy.shape[0], dy.shape[1]
    d = cp.ascontiguousarray(dy).reshape(N, M, -1)
    if N == 1:
        return d.reshape(M, -1)
    return cp.ascontiguousarray(d.transpose(1, 0, 2)).reshape(M, -1)


def conv2d(x, w, b=None, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
           z=None, activation="", alpha=0.0, beta=0.0):
    """2-D convolution on cupy arrays (float32/float16): y = act(W * x + b + z), NCHW.

    ``z`` (a residual of y's shape) and ``activation`` (a name of :data:`ACTIVATIONS`, with
    ``alpha``/``beta``) are the FusedConv epilogue, applied in the same pass as the bias.
    Ungrouped convolutions run as one GEMM ``W (M, K) @ cols (K, N*OH*OW)`` over every image
    (K-major im2col), whose epilogue writes the NCHW output; grouped ones as one
    strided-batched GEMM over images x groups; depthwise ones with a direct kernel."""
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
    if z is not None and tuple(z.shape) != (N, M, OH, OW):
        y = conv2d(x, w, b, strides=strides, pads=pads, dilations=dilations, group=group)
        y += z
        return epilogue(y, y, activation=activation, alpha=alpha, beta=beta) \
            if activation else y
    G = int(group)
    fused = z is not None or bool(activation)
    if G == C and Cg == 1 and M % C == 0 and G > 1:
        y = _depthwise(x, w, b, cp.empty((N, M, OH, OW), dtype=x.dtype), pb, st, dl)
        return epilogue(y, y, None, z, activation=activation, alpha=alpha, beta=beta) \
            if fused else y
    K = Cg * KH * KW
    L = OH * OW
    if G == 1:
        y = cp.empty((N, M, OH, OW), dtype=x.dtype)
        w2 = w.reshape(M, K)
        per_image = max(1, K * L * x.itemsize)
        chunk = max(1, min(N, COLS_BUDGET_BYTES // per_image))
        for n0 in range(0, N, chunk):
            n1 = min(N, n0 + chunk)
            cols = im2col_k(x[n0:n1], KH, KW, OH, OW, pb, st, dl)   # (K, n*L)
            g = cp.matmul(w2, cols)                                  # (M, n*L)
            epilogue(g, y[n0:n1], b, None if z is None else z[n0:n1],
                     transposed=n1 - n0 > 1, activation=activation, alpha=alpha, beta=beta)
        return y
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
    if b is not None or fused:
        epilogue(y, y, b, z, activation=activation, alpha=alpha, beta=beta)
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
    """dL/dx of :func:`conv2d`: col2im(W^T @ dy) per group (one GEMM when ungrouped)."""
    cp = cupy_module()
    N, C, H, W = x_shape
    M, Cg, KH, KW = w.shape
    G = int(group)
    _, _, OH, OW = dy.shape
    L = OH * OW
    K = Cg * KH * KW
    if G == 1:
        dcols = cp.matmul(cp.ascontiguousarray(w).reshape(M, K).T, _to_mnl(dy))  # (K, N*L)
        return col2im(dcols, N, C, H, W, KH, KW, OH, OW, [int(pads[0]), int(pads[1])],
                      list(strides), list(dilations), kmajor=True)
    wt = cp.ascontiguousarray(w).reshape(G, M // G, K).transpose(0, 2, 1)     # (G, K, M/G)
    d = cp.ascontiguousarray(dy).reshape(N, G, M // G, L)
    cols = cp.matmul(wt, d)                                                   # (N, G, K, L)
    return col2im(cols.reshape(N, C * KH * KW, L), N, C, H, W, KH, KW, OH, OW,
                  [int(pads[0]), int(pads[1])], list(strides), list(dilations))


def conv2d_backward_weight(dy, x, w_shape, *, strides=(1, 1), pads=(0, 0, 0, 0),
                           dilations=(1, 1), group=1):
    """dL/dW of :func:`conv2d`: sum over images of dy @ cols^T, per group (one GEMM over
    every image when ungrouped)."""
    cp = cupy_module()
    N, C, H, W = x.shape
    M, Cg, KH, KW = w_shape
    G = int(group)
    _, _, OH, OW = dy.shape
    L = OH * OW
    K = Cg * KH * KW
    if G == 1:
        cols = im2col_k(x, KH, KW, OH, OW, [int(pads[0]), int(pads[1])], list(strides),
                        list(dilations))                                     # (K, N*L)
        return cp.matmul(_to_mnl(dy), cols.T).reshape(M, Cg, KH, KW)
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
