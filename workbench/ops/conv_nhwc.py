"""Channels-last convolution: ``com.workbench::NhwcConv`` (internal, written by the layout
pass ``workbench.graph.layout``).

X is (N, H, W, C), the weights (kh, kw, C/group, M) ("HWIO", a Transpose of the ONNX weights
that constant folding bakes in), Z (a residual) and Y are (N, OH, OW, M). The epilogue is
FusedConv's: ``activation(conv + B + Z)``, applied to each block of the output in the worker
that computed it. Five paths, each split over the engine's threads (BLAS single-threaded):

- depthwise (group == C == M): 3x3 with stride 1 or 2 (float32, dilation 1, an epilogue that
  is a clip) in the C kernel ``dwconv_avx2.dw3x3`` when it is loaded (AVX2 + FMA CPUs with a
  C compiler; weights packed once per node, see :func:`pack_depthwise`), else the numba
  kernels ``conv_nhwc.dw_k{3,5}s{1,2}`` when they are loaded, else numpy tap by tap on
  blocks of output rows, every tap a multiply-add over whole (rows, OW, C) slices (channels
  contiguous);
- 1x1 (group 1): a plain ``(rows, C) @ (C, M)`` GEMM. float32, stride 1, no padding: the
  compiled C kernel ``gemm_avx2.gemm`` when it is loaded (AVX2 + FMA CPUs with a C compiler),
  with the weights packed once into 16-column panels and kept in the node's context (the
  plan's, see :func:`_packed`) and the epilogue fused into its stores; else numpy/BLAS per
  block of rows (strided inputs sampled first);
- group 1 with at most 4 input channels (the stems), float32, dilation 1, a clip epilogue:
  the C kernel ``dwconv_avx2.fewc`` straight from the input's memory (the NHWC view of an
  NCHW input is not copied), see :func:`_fewc`;
- the rest, group 1 (KxK, strided or padded 1x1), float32: the compiled indirect GEMM
  ``gemm_avx2.iconv`` when it is loaded (:func:`_indirect`: per output pixel and tap the offset
  of the input pixel it reads, from a table built once per shape set; the weights packed as
  the 1x1 path's; the epilogue fused);
- else im2col per block of output rows (each window a run of contiguous channels) into a
  cache-sized workspace, then ``(rows, kh*kw*C/g) @ (kh*kw*C/g, M/g)`` per group.

``NhwcConvChain`` (:func:`nhwc_conv_chain`, written by the layout pass): an inverted residual
(1x1 expand, depthwise 3x3, 1x1 project; ShuffleNet's branches, optionally interleaved into
their block's 2-group channel shuffle) in ``dwconv_avx2.chain`` band by band of output rows,
the same bits as the NhwcConv layers one after another (its fallback).

The bias/residual/clip epilogue runs in the compiled ``conv_nhwc.bias_act`` when loaded. The
numpy paths are the reference and the fallback; ``tests/ops/test_conv_nhwc.py`` checks both
against ``Conv`` on NCHW.

Per-call cost: a node whose run took a C path (depthwise or 1x1) twice with the same packed
weights keeps a pre-bound call in its context (:func:`_bound_call`): the kernel, call blocks
holding the packed weights' addresses, geometry and row ranges (a ctypes call costs ~0.4 µs
per argument, so the C kernels take one int64 block), and the weight check; later runs with
inputs of the same shapes check identity, shapes and the packed weights' sample, write the
X/Z/Y addresses into the blocks and call (the pool only for work worth splitting). Anything
else (another array, shape or weight values, kernels turned off) takes the full path, which
binds again.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from workbench import compiled
from workbench.arrays import xp_of
from workbench.arrays.geometry import window_geometry
from workbench.errors import ShapeError
from workbench.ops._common import to_compute
from workbench.ops.conv import apply_activation
from workbench.ops.nhwc import _row_stride, nhwc_concat_shuffle
from workbench.ops.parallel import (
    POOL_MIN,
    BlockTask,
    blas_controller,
    call_blocks,
    n_workers,
    pool_ready,
    run_blocks,
    scratch,
    single_threaded_blas,
)
from workbench.ops.registry import FUSED_DOMAIN, kernel
from workbench.ops.windows import spatial_ints

_BLOCK = 1 << 16   # output (or im2col) elements per block: stays in L2 with its inputs
_CLIPS = ("", "Relu", "Clip")   # activations the compiled epilogue does (as a clip)
_DW_COMPILED = {(3, 1), (3, 2), (5, 1), (5, 2)}   # (kernel, stride) with a compiled kernel
_DW_C = "dwconv_avx2.dw3x3"   # the C depthwise 3x3 kernel (strides 1, 2)
_SPLIT_MIN = 1 << 22   # multiply-adds under which a compiled call is not split over the pool
# (~0.1 ms of 1x1 GEMM: handing the halves of a smaller call to the pool measured 1.05-4x
# slower in wall time than one call on this 2-core machine under load) ...


def _split_min():
    """... unless the C block pool runs the blocks (its hand-off costs microseconds): then
    from ``parallel.POOL_MIN`` multiply-adds (~25-50 us of work)."""
    return POOL_MIN if pool_ready() else _SPLIT_MIN


def _bounds(activation, alpha, beta):
    """(lo, hi) of the clip an activation is, or None."""
    if activation == "":
        return -np.inf, np.inf
    if activation == "Relu":
        return 0.0, np.inf
    if activation == "Clip":
        return alpha, beta
    return None


_ONE = np.zeros(1, np.float32)   # stands for an absent bias or residual in kernel calls


class _Epilogue:
    """``activation(y + b + z)`` on blocks of output rows, compiled when it can be."""

    def __init__(self, b, z, activation, alpha, beta, M):
        self.b, self.z, self.M = b, z, M
        self.activation, self.alpha, self.beta = activation, alpha, beta
        self.clip = _bounds(activation, alpha, beta)
        self.z2 = None if z is None else z.reshape(-1, M)

    def __call__(self, y2, r0, r1):
        """Apply to ``y2`` = rows r0:r1 of the (rows, M) output (a contiguous block)."""
        z = None if self.z2 is None else self.z2[r0:r1]
        k = self.kernel(y2)
        if k is not None and (z is None or z.flags.c_contiguous):
            lo, hi = self.clip if self.clip is not None else (-np.inf, np.inf)
            k(y2, _ONE if self.b is None else self.b, _ONE if z is None else z, r1 - r0,
              self.M, int(self.b is not None), int(z is not None), 0, float(lo), float(hi))
            if self.clip is None:
                apply_activation(y2, self.activation, self.alpha, self.beta)
            return
        if self.b is not None:
            y2 += self.b
        if z is not None:
            y2 += z
        if self.activation:
            apply_activation(y2, self.activation, self.alpha, self.beta)

    def kernel(self, y2):
        """The compiled epilogue for this output's dtype (looked up once per call), or
        None."""
        if not hasattr(self, "_k"):
            self._k = compiled.kernel("conv_nhwc.bias_act") \
                if y2.dtype == np.float32 else None
        return self._k


def _row_jobs(rows, per_row, *, block=_BLOCK):
    """(r0, r1) ranges of whole output rows, about ``block`` elements each and at least
    2 per worker thread when there is enough work."""
    step = max(1, block // max(1, per_row))
    step = min(step, max(1, -(-rows // (2 * n_workers()))))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def pack_depthwise(w, b=None, lanes=8):
    """``(packed, bias)`` for ``dwconv_avx2.dw3x3``: (kh, kw, 1, C) weights as (kh*kw, Cp)
    and the bias (zeros when None) as (Cp,), Cp = C rounded up to ``lanes``, zeros past C.
    float32, C-contiguous."""
    kh, kw, _, C = (int(v) for v in w.shape)
    cp = -(-C // lanes) * lanes
    wp = np.zeros((kh * kw, cp), np.float32)
    wp[:, :C] = w.reshape(kh * kw, C)
    bp = np.zeros(cp, np.float32)
    if b is not None:
        bp[:C] = b
    return wp, bp


def call_block(ptrs, ints, lo, hi):
    """A C kernel's call block (``dwconv_avx2.dw3x3``, ``gemm_avx2.gemm_block``): int64
    slots, the addresses ``ptrs``, the integers ``ints``, then ``lo``/``hi`` as float64 bit
    patterns."""
    n = len(ptrs) + len(ints)
    blk = np.zeros(n + 2, np.int64)
    blk[:len(ptrs)] = ptrs
    blk[len(ptrs):n] = ints
    blk.view(np.float64)[n:] = (lo, hi)
    return blk


def dw_block(x, wp, bp, z, y, S, pb, out, r0, r1, lo, hi):
    """The call block of ``dwconv_avx2.dw3x3`` (see its description) for output rows
    r0:r1; ``z`` None for no residual."""
    N, H, W, C = (int(v) for v in x.shape)
    dp = compiled.data_pointer
    return call_block(
        [dp(x), dp(wp), dp(bp), dp(x if z is None else z), dp(y)],
        [N, H, W, C, out[0], out[1], S[0], pb[0], pb[1], int(z is not None), r0, r1], lo, hi)


def _depthwise_c(k, x, wp, bp, z, clip, S, pb, out, y):
    """The C path: ``dwconv_avx2.dw3x3`` on blocks of output rows (one call, no pool, when
    the work is too small to split)."""
    C = int(x.shape[3])
    rows = int(x.shape[0]) * out[0]
    lo, hi = float(clip[0]), float(clip[1])
    work = rows * out[1] * C * 9
    jobs = _row_jobs(rows, out[1] * C) if work >= _split_min() else [(0, rows)]
    call_blocks(k, [dw_block(x, wp, bp, z, y, S, pb, out, r0, r1, lo, hi)
                    for r0, r1 in jobs], work)
    return y


def _dw_uses_c(x, kh, kw, S, D, clip):
    """Whether this depthwise layer goes to ``dwconv_avx2.dw3x3`` (when it is loaded)."""
    return (x.dtype == np.float32 and kh == kw == 3 and S[0] == S[1] and S[0] in (1, 2)
            and D == [1, 1] and clip is not None)


def _depthwise(x, w, b, z, act, alpha, beta, S, D, pb, out, y, ctx=None, w_in=None,
               b_in=None):
    """y (N, OH, OW, C) = depthwise conv of x (N, H, W, C) with w (kh, kw, 1, C).
    ``w_in``/``b_in``: the node's weight and bias inputs as given (the packed weights' cache
    key in ``ctx``)."""
    N, H, W, C = (int(v) for v in x.shape)
    kh, kw = int(w.shape[0]), int(w.shape[1])
    OH, OW = out
    rows = N * OH
    clip = _bounds(act, alpha, beta)
    if _dw_uses_c(x, kh, kw, S, D, clip) and (z is None or z.flags.c_contiguous):
        k = compiled.kernel(_DW_C)
        if k is not None:
            wp, bp = _packed(ctx, w_in, b_in, w, b, key="dwconv_avx2_pack",
                             pack=pack_depthwise)
            if ctx is not None:   # what the node's pre-bound call needs
                ctx.extra["dwconv_avx2_args"] = (S, pb, out, clip)
            return _depthwise_c(k, x, wp, bp, z, clip, S, pb, out, y)
    if ctx is not None:   # another path: nothing to bind
        ctx.extra.pop("dwconv_avx2_pack", None)
    name = None
    if x.dtype == np.float32 and kh == kw and S[0] == S[1] and D == [1, 1] \
            and (kh, S[0]) in _DW_COMPILED:
        name = f"conv_nhwc.dw_k{kh}s{S[0]}"
    k = compiled.kernel(name) if name else None
    if k is not None:
        lo, hi = clip if clip is not None else (-np.inf, np.inf)
        wk = np.ascontiguousarray(w.reshape(kh, kw, C), dtype=np.float32)
        bk = np.zeros(C, np.float32) if b is None else np.ascontiguousarray(b, np.float32)
        zk = _ONE if z is None else z
        args = (x, wk, bk, zk, y, N, H, W, C, OH, OW, int(pb[0]), int(pb[1]),
                int(z is not None))

        def work(chunk):
            for r0, r1 in chunk:
                k(*args, r0, r1, float(lo), float(hi))
                if clip is None:
                    apply_activation(y.reshape(rows, -1)[r0:r1], act, alpha, beta)
        run_blocks(np, _row_jobs(rows, OW * C), work, rows * OW * C * kh * kw)
        return y
    # numpy: pad once, then per block of output rows one multiply-add per tap
    pe = [max(0, (o - 1) * s + (k_ - 1) * d + 1 - i - p)
          for o, s, k_, d, i, p in zip(out, S, (kh, kw), D, (H, W), pb)]
    xpad = x
    if any(pb) or any(pe):
        xpad = np.zeros((N, H + pb[0] + pe[0], W + pb[1] + pe[1], C), dtype=x.dtype)
        xpad[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x
    wt = w.reshape(kh, kw, C)
    epi = _Epilogue(b, z, act, alpha, beta, C)

    def work_np(chunk):
        for r0, r1 in chunk:
            tmp = scratch(np, (r1 - r0, OW, C), x.dtype, slot="nhwc_dw")
            acc = y.reshape(rows, OW, C)[r0:r1]
            acc[...] = 0
            n0, n1 = r0 // OH, (r1 - 1) // OH
            for n in range(n0, n1 + 1):
                a = max(r0, n * OH) - n * OH          # output rows of image n in this job
                e = min(r1, (n + 1) * OH) - n * OH
                dst = acc[n * OH + a - r0:n * OH + e - r0]
                t = tmp[:e - a]
                for i in range(kh):
                    for j in range(kw):
                        src = xpad[n, a * S[0] + i * D[0]:(e - 1) * S[0] + i * D[0] + 1:S[0],
                                   j * D[1]:j * D[1] + (OW - 1) * S[1] + 1:S[1]]
                        np.multiply(src, wt[i, j], out=t)
                        dst += t
            epi(acc.reshape(-1, C), r0 * OW, r1 * OW)
    run_blocks(np, _row_jobs(rows, OW * C), work_np, rows * OW * C * kh * kw)
    return y


_PANEL = 16   # columns per packed weight panel of gemm_avx2 (its register tile's width)
_SAMPLES = 16  # weight elements compared to tell an updated weight from the packed one


def pack_panels(w2, bias=None, panel=_PANEL):
    """``(packed, bias)`` for ``gemm_avx2.gemm``: (C, M) weights as ceil(M/panel) column
    panels of (C, panel) one after another, zeros past M; the bias (zeros when None) padded
    to the panels' width. float32, C-contiguous. (kh, kw, C, M) weights (``iconv``) are
    packed as their (kh*kw*C, M) reshape, read in place whatever their strides."""
    M = int(w2.shape[-1])
    mp = -(-M // panel) * panel
    bp = np.zeros(mp, np.float32)
    if bias is not None:
        bp[:M] = bias
    if w2.ndim != 2:   # (kh, kw, C, M), maybe a strided view of OIHW weights: panel by
        K = int(np.prod(w2.shape[:-1]))   # panel, each a block that stays in cache
        wp = np.zeros((mp // panel, K, panel), np.float32)
        for p in range(mp // panel):
            n = min(panel, M - p * panel)
            wp[p].reshape(*w2.shape[:-1], panel)[..., :n] = w2[..., p * panel:p * panel + n]
        return wp, bp
    C = int(w2.shape[0])
    wp = np.zeros((C, mp), np.float32)
    wp[:, :M] = w2
    return np.ascontiguousarray(wp.reshape(C, mp // panel, panel).transpose(1, 0, 2)), bp


def _sample(a, idx):
    """The bytes of ``a``'s elements at flat positions ``idx`` (bitwise: NaN matches; a
    strided ``a`` is not copied)."""
    return (a.reshape(-1) if a.flags.c_contiguous else a.flat)[idx].tobytes()


def _packed(ctx, w_in, b_in, w2, b, key="gemm_avx2_pack", pack=None):
    """The packed weights and padded bias of this node (``pack(w2, b)``, kept under ``key``:
    one per compiled path), made on its first compiled run and
    kept in its context (which lives with the plan): made again only when the weight or
    bias is another array (a trainable plan's Transpose output) or was updated in place
    (:data:`_SAMPLES` weight elements spread over the array, or any bias element,
    differ)."""
    got = None if ctx is None else ctx.extra.get(key)
    if got is not None and got[0] is w_in and got[1] is b_in \
            and _sample(w2, got[2]) == got[3] \
            and (b is None or b.tobytes() == got[4]):
        return got[5]
    packed = (pack or pack_panels)(w2, b)
    if ctx is not None:
        idx = np.linspace(0, max(0, w2.size - 1), min(_SAMPLES, w2.size)).astype(np.intp)
        ctx.extra[key] = (w_in, b_in, idx, _sample(w2, idx),
                          None if b is None else b.tobytes(), packed)
    return packed


def _panel_cuts(rows, M):
    """Panel cuts (16 output channels each) of a pooled 1x1 layer with few rows (under 64
    per thread: the 7x7 maps of batch 1, where every row range streams all the packed
    weights, e.g. 1.6 MB for MobileNetV2's 320 -> 1280 layer), one range per thread; None
    to split rows (enough rows, too few panels, one thread). A last panel of 8 columns or
    fewer is computed with the full one before it by ``gemm_avx2``: no cut between them."""
    nw = n_workers()
    panels = -(-M // _PANEL)
    if nw == 1 or rows >= 64 * nw or panels < 2 * nw:
        return None
    cuts = sorted({panels * i // nw for i in range(nw + 1)})
    if 0 < M % _PANEL <= 8 and panels - 1 in cuts[1:-1]:
        cuts.remove(panels - 1)
    return cuts


def _tile_jobs(rows, tile=6):
    """(r0, r1) ranges for the compiled GEMM: all rows in one call on one worker (the
    kernel blocks its rows itself), else about 4 ranges per worker, whole tiles each."""
    nw = n_workers()
    if nw == 1 or rows <= tile:
        return [(0, rows)]
    step = max(tile, -(-rows // (4 * nw) // tile) * tile)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def _pointwise_compiled(k, x, w2, packed, epi, y):
    """The compiled 1x1 path: ``Y = clip(X @ W + b + Z)`` by ``gemm_avx2.gemm``."""
    C, M = (int(v) for v in w2.shape)
    a = x.reshape(-1, C)
    rows = a.shape[0]
    wp, bp = packed
    z = epi.z2
    lo, hi = epi.clip
    dp = compiled.data_pointer
    args = (dp(a), dp(wp), dp(bp), dp(a if z is None else z), dp(y), C, M)
    has_z, lo, hi = int(z is not None), float(lo), float(hi)
    raw = k.raw
    jobs = _tile_jobs(rows)
    if len(jobs) == 1:   # one worker: one call, no pool
        raw(*args, 0, rows, has_z, lo, hi)
        return y

    def work(chunk):
        for r0, r1 in chunk:
            raw(*args, r0, r1, has_z, lo, hi)
    run_blocks(np, jobs, work, rows * M * C)
    return y


def indirection(H, W, C, kh, kw, S, D, pb, out):
    """The (OH*OW, kh*kw) int64 table of ``gemm_avx2.iconv``: for output pixel (oh, ow) of
    an image and tap (i, j), the offset (in elements) of the C channels of input pixel
    (oh*S0 - pb0 + i*D0, ow*S1 - pb1 + j*D1) in the (H, W, C) image, or -1 where that pixel
    is padding. Depends only on the shapes: built once per plan (:func:`_indirect`)."""
    OH, OW = out
    ih = np.arange(OH)[:, None] * S[0] - pb[0] + np.arange(kh)[None, :] * D[0]   # (OH, kh)
    iw = np.arange(OW)[:, None] * S[1] - pb[1] + np.arange(kw)[None, :] * D[1]   # (OW, kw)
    off = (ih[:, None, :, None] * W + iw[None, :, None, :]).astype(np.int64) * C
    ok = ((ih >= 0) & (ih < H))[:, None, :, None] & ((iw >= 0) & (iw < W))[None, :, None, :]
    return np.where(ok, off, -1).reshape(OH * OW, kh * kw)


def _conv_jobs(rows, tile=6):
    """(r0, r1) pixel ranges for ``iconv``: as :func:`_tile_jobs` (about 4 per worker, whole
    tiles), but not under 60 pixels unless that leaves a worker idle: each range streams all
    the packed weights once (ResNet's 3x3x512 layers: 9.4 MB for 49 pixels at batch 1)."""
    nw = n_workers()
    if nw == 1 or rows <= tile:
        return [(0, rows)]
    fine = -(-rows // (4 * nw) // tile) * tile
    even = -(-rows // nw // tile) * tile
    step = max(tile, fine, min(60, even))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


_TABLES: dict = {}   # (shapes) -> (key, indirection table, zero row): see _indirect
_ROW_TAPS_C = 8      # fewer input channels: a kernel row of taps is one tap (see _indirect)
_TABLES_LOCK = threading.Lock()


def _indirect(x, w, epi, S, D, pb, out, y, ctx=None, w_in=None, b_in=None):
    """Group 1, any kernel size/stride/padding/dilation, float32: the compiled indirect GEMM
    ``gemm_avx2.iconv`` (no im2col: per output pixel and tap, the offset of the input
    pixel's channels from a table kept in the node's context with the packed weights).
    Returns False (nothing done) when the kernel is not loaded or does not apply."""
    if x.dtype != np.float32 or (epi.z2 is not None and not epi.z2.flags.c_contiguous):
        return False
    k = compiled.kernel("gemm_avx2.iconv")
    if k is None:
        return False
    N, H, W, C = (int(v) for v in x.shape)
    kh, kw, _cg, M = (int(v) for v in w.shape)
    OH, OW = out
    rows_of_taps = C < _ROW_TAPS_C and kw > 1 and D[1] == 1
    if rows_of_taps:
        # few channels (the stems): each tap's 1-3 channels cost a pointer each; on a padded
        # copy of the input the kw taps of a kernel row are kw*C contiguous channels, so a
        # kernel row is one "tap" (the packed weights are the same: rows (i, j, c) in order)
        pe = [max(0, (o - 1) * s_ + (k_ - 1) * d + 1 - i - p)
              for o, s_, k_, d, i, p in zip(out, S, (kh, kw), D, (H, W), pb)]
        xpad = np.zeros((N, H + pb[0] + pe[0], W + pb[1] + pe[1], C), np.float32)
        xpad[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x
        x, H, W = xpad, int(xpad.shape[1]), int(xpad.shape[2])
        pb, taps, ct = (0, 0), kh, kw * C
    else:
        taps, ct = kh * kw, C
    key = (H, W, C, kh, kw, tuple(S), tuple(D), tuple(pb), tuple(out), rows_of_taps)
    got = None if ctx is None else ctx.extra.get("gemm_avx2_ind")
    if got is None or got[0] != key:
        # a trainable model's tape runs each node with a fresh context: a few tables are
        # kept here too, by shapes
        got = _TABLES.get(key)
        if got is None:
            table = indirection(H, W, C, kh, 1, S, D, pb, out) if rows_of_taps \
                else indirection(H, W, C, kh, kw, S, D, pb, out)
            got = (key, table, np.zeros(ct, np.float32))
            with _TABLES_LOCK:   # plans may run in several threads
                while len(_TABLES) >= 64:
                    _TABLES.pop(next(iter(_TABLES)))
                _TABLES[key] = got
        if ctx is not None:
            ctx.extra["gemm_avx2_ind"] = got
    ind, zero = got[1], got[2]
    b = None if epi.b is None else np.ascontiguousarray(epi.b, np.float32)
    wp, bp = _packed(ctx, w_in, b_in, w, b)
    z = epi.z2
    # an activation that is no clip (LeakyRelu, Sigmoid, ...) runs on each range after it
    lo, hi = epi.clip if epi.clip is not None else (-np.inf, np.inf)
    act = None if epi.clip is not None else epi.activation
    dp = compiled.data_pointer
    args = (dp(x), dp(ind), dp(zero), dp(wp), dp(bp), dp(x if z is None else z), dp(y), ct,
            taps, M, OH * OW, H * W * C)
    has_z, lo, hi = int(z is not None), float(lo), float(hi)
    raw = k.raw
    rows = N * OH * OW
    y2 = y.reshape(rows, M)
    if act is None and _iconv_pooled(args, rows, M, C * kh * kw, has_z, lo, hi, ctx, key,
                                     wp, not rows_of_taps):
        return True

    def work(chunk):
        for r0, r1 in chunk:
            raw(*args, r0, r1, has_z, lo, hi)
            if act:
                apply_activation(y2[r0:r1], act, epi.alpha, epi.beta)
    jobs = _conv_jobs(rows)
    if len(jobs) == 1:   # one worker: one call, no pool
        work(jobs)
    else:
        run_blocks(np, jobs, work, rows * M * C * kh * kw)
    return True


def _iconv_jobs(rows, M, nw):
    """``(r0, r1, q0, q1)`` pieces of an ``iconv_block`` layer over ``nw`` threads: the
    pixel ranges of :func:`_conv_jobs` (all output channels) when every thread gets two
    ranges of at least 64 pixels, else (the 7x7 and 14x14 maps of batch 1) all the pixels
    in one range of whole 16-column panels per thread: a pixel range streams all the packed
    weights (ResNet's 3x3x512 layers: 9.4 MB for 49 pixels), a panel range only its part
    (2 threads, one process, 3x3 layers 7x7x512 / 14x14x256: 2.02 / 1.83 ms in 2 panel
    ranges, 2.12 / 1.87 in 4, 2.50 / 2.04 in pixel ranges; AMD EPYC, AVX2)."""
    panels = -(-M // _PANEL)
    if nw == 1:
        return [(0, rows, 0, panels)]
    if rows >= 128 * nw or panels < 2 * nw:
        return [(r0, r1, 0, panels) for r0, r1 in _conv_jobs(rows)]
    k = nw
    cuts = [panels * i // k for i in range(k + 1)]
    return [(0, rows, q0, q1) for q0, q1 in zip(cuts, cuts[1:]) if q1 > q0]


def _iconv_pooled(args, rows, M, K, has_z, lo, hi, ctx, key, wp, bindable):
    """``_indirect``'s call as ``gemm_avx2.iconv_block`` pieces run by the C block pool
    (:class:`~workbench.ops.parallel.BlockTask`; the pieces' blocks kept in the node's
    context, only the X/Z/Y addresses written per call; ``bindable``: they read the node's
    X and Z in place, so that its pre-bound call (:func:`_bound_call`) may use them). False
    (nothing done) when the entry or the pool is not loaded."""
    kb = compiled.kernel("gemm_avx2.iconv_block")
    if kb is None or not pool_ready():
        return False
    work = rows * M * K
    nw = n_workers() if work >= _split_min() else 1
    jobs = _iconv_jobs(rows, M, nw)
    ident = (key, id(wp), tuple(args[1:5]), tuple(args[7:]), tuple(jobs), has_z, lo, hi)
    got = None if ctx is None else ctx.extra.get("iconv_task")
    busy = None
    if got is not None and got[0] == ident and got[2].acquire(False):
        task, busy = got[1], got[2]
    else:
        # slots: 7 addresses, C, taps, M, OH*OW, H*W*C, r0, r1, has_z, lo, hi, q0, q1
        task = BlockTask(kb, [np.concatenate([
            call_block(list(args[:7]), list(args[7:]) + [r0, r1, has_z], lo, hi),
            np.array([q0, q1], np.int64)]) for r0, r1, q0, q1 in jobs])
        if ctx is not None:
            busy = threading.Lock()
            busy.acquire()
            ctx.extra["iconv_task"] = (ident, task, busy)
    try:
        for blk in task.blocks:
            blk[0], blk[5], blk[6] = args[0], args[5], args[6]
        task(work)
    finally:
        if busy is not None:
            busy.release()
    if bindable and ctx is not None and ctx.extra.get("iconv_task", (None,))[0] == ident:
        ctx.extra["iconv_ran"], ctx.extra["iconv_work"] = True, work
    return True


_FEWC = "dwconv_avx2.fewc"   # the C convolution for few input channels (stems)
_FEWC_MAX = 4   # input channels up to which a group-1 KxK convolution goes to it
#: ... and the largest kernel (taps) and output width it takes: measured on the 2-core AVX2
#: AMD EPYC (one thread, CPU ms, fewc vs iconv from the NHWC view of an NCHW 224x224 RGB
#: input): 3x3 s2 -> 32 b8 6.4 vs 8.8 and b1 0.88 vs 0.95, -> 24 b8 6.7 vs 6.6; but 7x7 s2
#: -> 64 (ResNet's stem) b1 7.6 vs 5.5 and b8 69 vs 45, 7x7 -> 32 b8 24 vs 18, 3x3 -> 64 b8
#: 14.9 vs 12.4, 5x5 -> 64 b8 26.7 vs 22.4: wider kernels and outputs stay on iconv
_FEWC_MAX_TAPS = 9
_FEWC_MAX_M = 32


def pack_fewc(w, b=None, lanes=8):
    """``(packed, bias)`` for ``dwconv_avx2.fewc``: (kh, kw, C, M) weights (any strides) as
    (kh*kw*C, Mp) and the bias (zeros when None) as (Mp,), Mp = M rounded up to ``lanes``,
    zeros past M. float32, C-contiguous."""
    M = int(w.shape[-1])
    mp = -(-M // lanes) * lanes
    wp = np.zeros((int(np.prod(w.shape[:-1])), mp), np.float32)
    wp[:, :M] = w.reshape(-1, M)
    bp = np.zeros(mp, np.float32)
    if b is not None:
        bp[:M] = b
    return wp, bp


def _fewc(x, w, b, z, act, p, S, D, pb, out, y, ctx, w_in, b_in):
    """Group 1, at most :data:`_FEWC_MAX` input channels (a stem on RGB images), float32,
    dilation 1, a clip-like epilogue: ``dwconv_avx2.fewc`` straight from x's memory (the
    layout pass' NHWC view of an NCHW input is read in place, no copy, no padded copy).
    Returns False (nothing done) when it does not apply or the kernel is not loaded."""
    clip = _bounds(act, p[0], p[1])
    if x.dtype != np.float32 or w.dtype != np.float32 or clip is None or list(D) != [1, 1] \
            or (z is not None and not z.flags.c_contiguous) \
            or any(s % 4 for s in x.strides) or min(out) < 1 or x.size == 0:
        return False
    k = compiled.kernel(_FEWC)
    if k is None:
        return False
    N, H, W, C = (int(v) for v in x.shape)
    kh, kw, _, M = (int(v) for v in w.shape)
    wp, bp = _packed(ctx, w_in, b_in, w, b, key="fewc_pack", pack=pack_fewc)
    OH, OW = out
    rows = N * OH
    work = rows * OW * M * kh * kw * C
    jobs = _row_jobs(rows, OW * M) if work >= _split_min() else [(0, rows)]
    dp = compiled.data_pointer
    sn, sh, sw, sc = (int(s) // 4 for s in x.strides)
    ptrs = [dp(x), dp(wp), dp(bp), dp(y if z is None else z), dp(y)]
    ints = [N, H, W, C, OH, OW, M, kh, kw, S[0], S[1], pb[0], pb[1], sn, sh, sw, sc,
            int(z is not None)]
    call_blocks(k, [call_block(ptrs, ints + [r0, r1], float(clip[0]), float(clip[1]))
                        for r0, r1 in jobs], work)
    return True


def _contiguous(x):
    """x as a C-contiguous array. A few-channel view of NCHW data (the network input after
    the layout pass' NHWC Transpose, a view) is copied one channel plane at a time: numpy
    gathers 3-value pixels slowly (0.46 -> 0.08 ms for [1, 224, 224, 3] on AMD EPYC)."""
    if x.flags.c_contiguous:
        return x
    C = int(x.shape[-1])
    if C >= _ROW_TAPS_C or x.strides[-1] <= x.itemsize * C:
        return np.ascontiguousarray(x)
    y = np.empty(x.shape, x.dtype)
    for c in range(C):
        y[..., c] = x[..., c]
    return y


def _packs(W, dt, group):
    """Whether the weights go to the compiled GEMMs, which pack them (any strides) and read
    no other copy: then they are not made contiguous first. Every numpy path reads them
    through a reshape (contiguous), so BLAS gets the same matrix either way."""
    return group == 1 and dt == np.float32 and W.dtype == np.float32 \
        and compiled.kernel("gemm_avx2.iconv") is not None


def _pointwise(x, w, epi, S, pb, out, y, ctx=None, w_in=None, b_in=None):
    """1x1, group 1: rows of (N*OH*OW, C) @ (C, M). ``w_in``/``b_in``: the node's weight
    and bias inputs as given (the packed weights' cache key)."""
    N, H, W, C = (int(v) for v in x.shape)
    M = int(w.shape[-1])
    OH, OW = out
    if x.dtype == np.float32 and not any(pb) and S == [1, 1] and (OH, OW) == (H, W) \
            and epi.clip is not None and (epi.z2 is None or epi.z2.flags.c_contiguous):
        k = compiled.kernel("gemm_avx2.gemm")
        if k is not None:
            w2 = w.reshape(C, M)
            b = None if epi.b is None else np.ascontiguousarray(epi.b, np.float32)
            return _pointwise_compiled(k, x, w2, _packed(ctx, w_in, b_in, w2, b), epi, y)
    if any(pb) or S != [1, 1] or (OH, OW) != (H, W):
        if _indirect(x, w, epi, S, [1, 1], pb, out, y, ctx, w_in, b_in):
            return y
        src = x
        if any(pb):
            src = np.zeros((N, H + pb[0], W + pb[1], C), dtype=x.dtype)
            src[:, pb[0]:, pb[1]:] = x
        src = src[:, :(OH - 1) * S[0] + 1:S[0], :(OW - 1) * S[1] + 1:S[1]]
        xs = np.empty((N, OH, OW, C), dtype=x.dtype)
        if src.shape[1:3] == (OH, OW):
            xs[...] = src
        else:  # pads past the input's end: the outputs there read zeros
            xs[...] = 0
            xs[:, :src.shape[1], :src.shape[2]] = src
        x = xs
    a = x.reshape(-1, C)
    w2 = np.ascontiguousarray(w.reshape(C, M))   # see _packs
    y2 = y.reshape(-1, M)
    rows = a.shape[0]

    def work(chunk):
        for r0, r1 in chunk:
            np.matmul(a[r0:r1], w2, out=y2[r0:r1])
            epi(y2[r0:r1], r0, r1)
    with single_threaded_blas(blas_controller()):
        run_blocks(np, _gemm_jobs(rows, M), work, rows * M * C)
    return y


def _gemm_jobs(rows, M):
    """(r0, r1) ranges of GEMM rows: an output block of about ``_BLOCK`` elements (its
    epilogue runs while it is in L2), as few calls as that allows (each BLAS call packs the
    weights again, and rows split finer than the block re-read weights that do not fit in
    cache: measured 1.3-1.5x slower on MobileNetV2's 7x7 layers at batch 1), and one range
    per worker at least when the engine runs several."""
    step = max(1, _BLOCK // max(1, M))
    nw = n_workers()
    if nw > 1:
        step = min(step, max(1, -(-rows // nw)))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def _im2col(x, w, group, epi, S, D, pb, out, y):
    """General (kh x kw, any group): per block of output rows, the windows copied into a
    workspace (each tap a run of channels), then one GEMM per group."""
    N, H, W, C = (int(v) for v in x.shape)
    kh, kw, Cg, M = (int(v) for v in w.shape)
    Mg = M // group
    OH, OW = out
    pe = [max(0, (o - 1) * s + (k_ - 1) * d + 1 - i - p)
          for o, s, k_, d, i, p in zip(out, S, (kh, kw), D, (H, W), pb)]
    xpad = x
    if any(pb) or any(pe):
        xpad = np.zeros((N, H + pb[0] + pe[0], W + pb[1] + pe[1], C), dtype=x.dtype)
        xpad[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x
    sN, sH, sW, sC = xpad.strides
    win = np.lib.stride_tricks.as_strided(
        xpad, shape=(N, OH, OW, kh, kw, C),
        strides=(sN, sH * S[0], sW * S[1], sH * D[0], sW * D[1], sC), writeable=False)
    K = kh * kw * Cg
    wg = np.ascontiguousarray(w.reshape(kh * kw * Cg, M))  # rows (i, j, c), as the windows
    y2 = y.reshape(-1, M)
    per_row = OW * K  # im2col elements per output row (one group)

    def work(chunk):
        for r0, r1 in chunk:  # rows of the output grid (n * OH + oh)
            n0, n1 = r0 // OH, (r1 - 1) // OH
            cols = scratch(np, ((r1 - r0) * OW, K), x.dtype, slot="nhwc_cols")
            for g in range(group):
                c3 = cols.reshape(r1 - r0, OW, kh, kw, Cg)
                for n in range(n0, n1 + 1):
                    a = max(r0, n * OH) - n * OH
                    e = min(r1, (n + 1) * OH) - n * OH
                    np.copyto(c3[n * OH + a - r0:n * OH + e - r0],
                              win[n, a:e, :, :, :, g * Cg:(g + 1) * Cg])
                dst = y2[r0 * OW:r1 * OW]
                if group == 1:
                    np.matmul(cols, wg, out=dst)
                else:
                    dst[:, g * Mg:(g + 1) * Mg] = cols @ wg[:, g * Mg:(g + 1) * Mg]
            epi(y2[r0 * OW:r1 * OW], r0 * OW, r1 * OW)
    with single_threaded_blas(blas_controller()):
        run_blocks(np, _row_jobs(N * OH, max(per_row, OW * M)), work,
                   N * OH * OW * K * M)
    return y


_BOUND = "nhwc_bound"   # ctx.extra key of a node's pre-bound compiled call
_ICONV = "iconv"   # _bound_call's kind for a run that took _iconv_pooled
_F32 = np.dtype(np.float32)


def _is_f32(a):
    return type(a) is np.ndarray and a.dtype == _F32 and a.flags.c_contiguous


def _bound_call(X, W, B, Z, y_shape, pack_key, ctx):
    """For a node whose last run took a compiled path with weights packed under
    ``pack_key``: a function ``(X, W, B, Z) -> Y or None`` that repeats that run for inputs
    like these with everything looked up, packed and checked once here (kernel, call blocks
    with the packed weights' addresses, geometry and row ranges), or None when this run
    cannot be bound. It answers None (the full path runs, and binds again) when an input is
    another array or shape, the weight or bias was changed in place (the packing's check,
    :func:`_packed`), or compiled kernels were turned off."""
    got = ctx.extra.get("gemm_avx2_pack" if pack_key == _ICONV else pack_key)
    if got is None or got[0] is not W or got[1] is not B or not _is_f32(X) \
            or not _is_f32(W) or (B is not None and not _is_f32(B)) \
            or (Z is not None and (not _is_f32(Z) or Z.shape != y_shape)):
        return None
    N, H, Wd, C = (int(v) for v in X.shape)
    wp, bp = got[5]
    y0 = np.empty(y_shape, np.float32)   # stands for the output in the blocks made here
    at = (0, 3, 4)   # the slots of the X, Z and Y addresses in a call block
    task = lock = None
    if pack_key == _ICONV:   # the blocks _iconv_pooled keeps (and their lock)
        kept = ctx.extra.get("iconv_task")
        if kept is None:
            return None
        _ident, task, lock = kept
        k, blocks, work, at = task.kernel, task.blocks, ctx.extra["iconv_work"], (0, 5, 6)
    elif pack_key == "dwconv_avx2_pack":
        k = compiled.kernel(_DW_C)
        S, pb, out, clip = ctx.extra["dwconv_avx2_args"]
        rows, per_row = N * y_shape[1], y_shape[2] * C
        work = rows * per_row * 9
        jobs = _row_jobs(rows, per_row) if work >= _split_min() else [(0, rows)]
        blocks = [dw_block(X, wp, bp, Z, y0, S, pb, out, r0, r1, *clip) for r0, r1 in jobs]
    else:
        k = compiled.kernel("gemm_avx2.gemm_block")
        M = int(y_shape[3])
        rows = N * H * Wd
        work = rows * M * C
        lo, hi = ctx.extra["gemm_avx2_clip"]
        dp = compiled.data_pointer
        ptrs = [dp(X), dp(wp), dp(bp), dp(X if Z is None else Z), dp(y0)]
        split = work >= _split_min()
        cuts = _panel_cuts(rows, M) if split and pool_ready() else None
        kp = None if cuts is None else compiled.kernel("gemm_avx2.gemm_panels_block")
        if kp is not None:   # few rows: ranges of output channels, all the rows
            k = kp
            blocks = [np.concatenate([call_block(ptrs, [C, M, 0, rows, int(Z is not None)],
                                                 lo, hi), np.array([q0, q1], np.int64)])
                      for q0, q1 in zip(cuts, cuts[1:])]
        else:
            blocks = [call_block(ptrs, [C, M, r0, r1, int(Z is not None)], lo, hi)
                      for r0, r1 in (_tile_jobs(rows) if split else [(0, rows)])]
    if k is None:
        return None
    raw, dp = k.raw, compiled.data_pointer
    # per block: its address and a ctypes view to write the X, Z and Y addresses into
    slots = [(dp(blk), (ctypes.c_int64 * 7).from_buffer(blk), blk) for blk in blocks]
    task = task or BlockTask(k, blocks)
    ax, az, ay = at
    x_shape, z_shape, w_flat = X.shape, None if Z is None else Z.shape, W.reshape(-1)
    idx, w_sample, b_bytes = got[2], got[3], got[4]
    enabled = compiled.enabled
    empty = np.empty
    busy = lock or threading.Lock()   # the blocks are shared: a second thread takes the
    # full path

    def bound(X_, W_, B_, Z_):
        if W_ is not W or B_ is not B or type(X_) is not np.ndarray or X_.shape != x_shape \
                or X_.dtype is not _F32 or not X_.flags.c_contiguous:
            return None
        if Z_ is None:
            if z_shape is not None:
                return None
        elif type(Z_) is not np.ndarray or Z_.shape != z_shape or Z_.dtype is not _F32 \
                or not Z_.flags.c_contiguous:
            return None
        if w_flat[idx].tobytes() != w_sample or (b_bytes is not None
                                                  and B_.tobytes() != b_bytes) \
                or not enabled():
            return None
        if not busy.acquire(False):
            return None
        try:
            y = empty(y_shape, _F32)
            px, py = dp(X_), dp(y)
            pz = px if Z_ is None else dp(Z_)
            if len(slots) == 1:
                addr, view, _ = slots[0]
                view[ax], view[az], view[ay] = px, pz, py
                raw(addr)
                return y
            for _, view, _ in slots:
                view[ax], view[az], view[ay] = px, pz, py
            task(work)
            return y
        finally:
            busy.release()
    return bound


def _bind(ctx, X, W, B, Z, y, pack_key):
    """Keep (or drop) this node's pre-bound call after a run (see :func:`_bound_call`)."""
    try:
        bound = _bound_call(X, W, B, Z, tuple(y.shape), pack_key, ctx)
    except (KeyError, TypeError, ValueError):
        bound = None
    if bound is None:
        ctx.extra.pop(_BOUND, None)
    else:
        ctx.extra[_BOUND] = bound


@kernel("NhwcConv", since=1, domain=FUSED_DOMAIN, category="layer", wants_ctx=True)
def nhwc_conv(X, W, B=None, Z=None, *, activation="", activation_params=(),
              auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
              strides=None, ctx=None):
    """Channels-last 2-D convolution (see the module docstring): X (N, H, W, C), W (kh, kw,
    C/group, M), B (M,), Z and Y (N, OH, OW, M); ``activation`` as FusedConv's."""
    if ctx is not None:
        bound = ctx.extra.get(_BOUND)
        if bound is not None:
            y = bound(X, W, B, Z)
            if y is not None:
                return y
    op = "NhwcConv"
    group = int(group)
    if X.ndim != 4 or W.ndim != 4:
        raise ShapeError(f"{op}: X must be (N, H, W, C) and W (kh, kw, C/group, M), got X "
                         f"{tuple(X.shape)}, W {tuple(W.shape)}")
    N, H, Wd, C = (int(v) for v in X.shape)
    kh, kw, Cg, M = (int(v) for v in W.shape)
    if group < 1 or Cg * group != C or M % group:
        raise ShapeError(f"{op}: X has {C} channels and W has shape {tuple(W.shape)} with "
                         f"group={group}; need W.shape[2] * group == C and W.shape[3] "
                         f"divisible by group")
    if B is not None and tuple(B.shape) != (M,):
        raise ShapeError(f"{op}: bias B must have shape ({M},), got {tuple(B.shape)}")
    if kernel_shape is not None and len(kernel_shape) and list(kernel_shape) != [kh, kw]:
        raise ShapeError(f"{op}: kernel_shape={list(kernel_shape)} does not match the "
                         f"weight's (kh, kw) = ({kh}, {kw})")
    st = spatial_ints(op, "strides", strides, 2, 1)
    dl = spatial_ints(op, "dilations", dilations, 2, 1)
    pb, _pe, out, _extra = window_geometry(op, (H, Wd), (kh, kw), st, dl, pads, auto_pad)
    xp = xp_of(X, W)
    x = to_compute(X)
    dt = x.dtype
    # contiguous: a trainable model's HWIO weights come from a Transpose (a view) in its
    # plan, and BLAS given a strided matrix may add the terms in another order than for the
    # baked constant of backend.prepare (the two must agree bit for bit)
    w = np.ascontiguousarray(W, dtype=dt) if xp is np and not _packs(W, dt, group) \
        else W.astype(dt, copy=False)
    b = None if B is None else B.astype(dt, copy=False).reshape(M)
    z = None
    p = [float(v) for v in (activation_params or ())] + [0.0, 0.0]
    shape = (N, out[0], out[1], M)
    late_z = None
    if Z is not None:
        if tuple(Z.shape) == shape:
            z = np.ascontiguousarray(Z, dtype=dt)
        else:  # a residual that broadcasts: added (and the activation applied) afterwards
            late_z = Z
    act = "" if late_z is not None else activation
    y = xp.empty(shape, dtype=dt)
    if y.size == 0:
        pass
    elif xp is not np:  # pragma: no cover - the layout pass runs for CPU plans only
        raise ShapeError(f"{op} runs on numpy arrays (CPU plans) only")
    else:
        pack_key = None
        packs = None if ctx is None else (ctx.extra.get("dwconv_avx2_pack"),
                                          ctx.extra.get("gemm_avx2_pack"))
        if group == C and M == C and Cg == 1 and kh * kw > 1:
            x = _contiguous(x)
            _depthwise(x, w, b, z, act, p[0], p[1], st, dl, pb, out, y, ctx, W, B)
            pack_key = "dwconv_avx2_pack"
        elif group == 1 and 1 < kh * kw <= _FEWC_MAX_TAPS and C <= _FEWC_MAX \
                and M <= _FEWC_MAX_M and _fewc(
                x, w, b, z, act, p, st, dl, pb, out, y, ctx, W, B):
            pass
        else:
            x = _contiguous(x)
            epi = _Epilogue(b, z, act, p[0], p[1], M)
            if kh == kw == 1 and group == 1:
                _pointwise(x, w, epi, st, pb, out, y, ctx, W, B)
                if epi.clip is not None and not any(pb) and st == [1, 1]:
                    pack_key = "gemm_avx2_pack"
                    if ctx is not None:
                        ctx.extra["gemm_avx2_clip"] = (float(epi.clip[0]),
                                                       float(epi.clip[1]))
            elif not (group == 1 and _indirect(x, w, epi, st, dl, pb, out, y, ctx, W, B)):
                _im2col(x, w, group, epi, st, dl, pb, out, y)
            if ctx is not None and ctx.extra.pop("iconv_ran", None) and x is X and z is Z:
                pack_key = _ICONV   # iconv_block read X and Z in place: bound from now on
        if ctx is not None:
            # bound on the second run with the same packed weights (a trainable plan's
            # weights are a new array every run: never bound, never paid for)
            now = None if pack_key is None else ctx.extra.get(
                "gemm_avx2_pack" if pack_key == _ICONV else pack_key)
            reused = now is not None and late_z is None and packs[
                0 if pack_key == "dwconv_avx2_pack" else 1] is now
            if reused:
                _bind(ctx, X, W, B, Z, y, pack_key)
            else:
                ctx.extra.pop(_BOUND, None)
    if late_z is not None:
        if np.broadcast_shapes(shape, tuple(late_z.shape)) == shape:
            y += late_z.astype(dt, copy=False)
        else:
            y = (y + late_z).astype(dt, copy=False)
        y = apply_activation(y, activation, p[0], p[1])
    return y if y.dtype == X.dtype else y.astype(X.dtype)



# ------------------------------------------------------------------ inverted-residual chains
_CHAIN_C = "dwconv_avx2.chain"
_CHAIN_BYTES = 256 << 10   # a band's scratch (expanded rows + depthwise rows): stays in L2
_CHAIN_STAGES = ("expand", "dw", "project")


class _SubContext:
    """A chain stage's own node context when the chain runs as separate NhwcConv calls."""

    __slots__ = ("extra",)

    def __init__(self):
        self.extra = {}


def _chain_band(S, W, OW, C1):
    """Output rows per band of ``dwconv_avx2.chain``: its two scratch buffers
    (``(band-1)*S + 3`` expanded rows of W x C1, ``band`` depthwise rows of OW x C1) within
    :data:`_CHAIN_BYTES`, at least one row."""
    row_e, row_d = W * C1 * 4, OW * C1 * 4
    return max(1, (_CHAIN_BYTES - (3 - S) * row_e) // max(1, S * row_e + row_d))


def _chain_stages(X, We, Be, Wd, Bd, Wp, Bp, Z, attrs, ctx):
    """The chain as NhwcConv calls one after another (the reference; also the path when
    the C chain does not apply)."""
    subs = None if ctx is None else ctx.extra.setdefault(
        "chain_subs", (_SubContext(), _SubContext(), _SubContext()))
    y = X
    if We is not None:
        y = nhwc_conv(y, We, Be, activation=attrs["expand_activation"],
                      activation_params=attrs["expand_params"],
                      ctx=None if subs is None else subs[0])
    y = nhwc_conv(y, Wd, Bd, activation=attrs["dw_activation"],
                  activation_params=attrs["dw_params"], group=int(Wd.shape[3]),
                  strides=attrs["strides"], pads=attrs["pads"], auto_pad=attrs["auto_pad"],
                  ctx=None if subs is None else subs[1])
    if Wp is not None:
        y = nhwc_conv(y, Wp, Bp, Z, activation=attrs["project_activation"],
                      activation_params=attrs["project_params"],
                      ctx=None if subs is None else subs[2])
    return y


def _clip_of(activation, params):
    p = [float(v) for v in (params or ())] + [0.0, 0.0]
    return _bounds(activation, p[0], p[1])


@kernel("NhwcConvChain", since=1, domain=FUSED_DOMAIN, category="layer", wants_ctx=True)
def nhwc_conv_chain(X, We=None, Be=None, Wd=None, Bd=None, Wp=None, Bp=None, Z=None,
                    I=None, *, strides=(1, 1), pads=None, auto_pad="NOTSET",  # noqa: E741
                    expand_activation="", expand_params=(), dw_activation="", dw_params=(),
                    project_activation="", project_params=(), interleave_first=1, ctx=None):
    """MobileNet's inverted-residual chain, channels-last (written by the layout pass, see
    :func:`workbench.graph.layout.chain_convs`): an optional 1x1 expand (We (1, 1, C0, C1),
    Be), a depthwise 3x3 (Wd (3, 3, 1, C1), Bd; ``strides``/``pads``/``auto_pad``), an
    optional 1x1 project (Wp (1, 1, C1, M), Bp, residual Z), each with its FusedConv
    activation: exactly ``NhwcConv`` three times. With ``I`` (ShuffleNet's other half), the
    result then goes through ``NhwcConcatShuffle(I, result, groups=2)`` (``(result, I)``
    when ``interleave_first`` is 0). On float32 with clip-like activations and the C kernels
    loaded it runs ``dwconv_avx2.chain`` (band by band of output rows, the expanded rows in
    L2, each band's result interleaved straight into the output; the same bits as the
    separate layers); else the separate layers."""
    attrs = {"strides": list(strides), "pads": pads, "auto_pad": auto_pad,
             "expand_activation": expand_activation, "expand_params": expand_params,
             "dw_activation": dw_activation, "dw_params": dw_params,
             "project_activation": project_activation, "project_params": project_params}
    if Wd is None or Wd.ndim != 4 or X.ndim != 4:
        raise ShapeError(f"NhwcConvChain: needs X (N, H, W, C) and depthwise weights "
                         f"(3, 3, 1, C), got X {tuple(X.shape)}, Wd "
                         f"{None if Wd is None else tuple(Wd.shape)}")
    first = bool(int(interleave_first))
    if ctx is not None:
        fast = ctx.extra.get("chain_fast")
        if fast is not None:
            y = fast(X, We, Be, Wd, Bd, Wp, Bp, Z, I)
            if y is not None:
                return y
            ctx.extra.pop("chain_fast", None)
    y = _chain_c(X, We, Be, Wd, Bd, Wp, Bp, Z, attrs, ctx, I, first)
    if y is None:
        y = _chain_stages(X, We, Be, Wd, Bd, Wp, Bp, Z, attrs, ctx)
        if I is not None:
            y = nhwc_concat_shuffle(*((I, y) if first else (y, I)), groups=2)
    return y


def _chain_c(X, We, Be, Wd, Bd, Wp, Bp, Z, attrs, ctx, I=None, first=True):  # noqa: E741
    """``dwconv_avx2.chain`` when it applies (else None: nothing done)."""
    f32 = np.float32
    arrays = [a for a in (X, We, Be, Wd, Bd, Wp, Bp, Z, I) if a is not None]
    if any(type(a) is not np.ndarray or a.dtype != f32 for a in arrays):
        return None
    clips = [_clip_of(attrs[f"{s}_activation"], attrs[f"{s}_params"]) for s in _CHAIN_STAGES]
    if any(c is None for c in clips):
        return None
    k, g = compiled.kernel(_CHAIN_C), compiled.kernel("gemm_avx2.gemm")
    if k is None or g is None:
        return None
    N, H, W, C0 = (int(v) for v in X.shape)
    C1 = int(Wd.shape[3])
    if tuple(Wd.shape) != (3, 3, 1, C1) \
            or (We is not None and tuple(We.shape) != (1, 1, C0, C1)) \
            or (We is None and C0 != C1) or (Wp is not None and (
                Wp.ndim != 4 or tuple(Wp.shape[:3]) != (1, 1, C1))):
        return None
    M = C1 if Wp is None else int(Wp.shape[3])
    for b, m in ((Be, C1), (Bd, C1), (Bp, M)):
        if b is not None and b.size != m:
            return None
    st = spatial_ints("NhwcConvChain", "strides", attrs["strides"], 2, 1)
    pb, _pe, out, _extra = window_geometry("NhwcConvChain", (H, W), (3, 3), st, [1, 1],
                                           attrs["pads"], attrs["auto_pad"])
    S = st[0]
    if st[1] != S or S not in (1, 2) or (Z is not None and (
            Wp is None or tuple(Z.shape) != (N, out[0], out[1], M))):
        return None
    OH, OW = out
    sa = None
    if I is not None:
        sa = _row_stride(I) if Wp is not None and tuple(I.shape) == (N, OH, OW, M) else None
        if sa is None:
            return None
    y = np.empty((N, OH, OW, M if I is None else 2 * M), f32)
    if y.size == 0:
        return y
    x = _contiguous(X)
    z = None if Z is None else np.ascontiguousarray(Z)
    packs = []
    if We is not None:
        packs.append(_packed(ctx, We, Be, We.reshape(C0, C1),
                             None if Be is None else Be.reshape(C1), key="chain_expand"))
    packs.append(_packed(ctx, Wd, Bd, Wd, None if Bd is None else Bd.reshape(C1),
                         key="chain_dw", pack=pack_depthwise))
    if Wp is not None:
        packs.append(_packed(ctx, Wp, Bp, Wp.reshape(C1, M),
                             None if Bp is None else Bp.reshape(M), key="chain_project"))
    key = (x.shape, M, z is not None, I is not None, first,
           tuple(id(a) for p in packs for a in p))
    got = None if ctx is None else ctx.extra.get("chain_bound")
    busy = None
    if got is not None and got[0] == key and got[3].acquire(False):
        blocks, task, busy = got[1], got[2], got[3]
    else:
        blocks = _chain_blocks(g, packs, We is not None, Wp is not None, z is not None,
                               (N, H, W, C0, C1, M, OH, OW, S, pb), clips,
                               None if I is None else first)
        task = None if len(blocks) == 1 else BlockTask(k, [blk for blk, _ in blocks])
        if ctx is not None and (got is None or got[0] != key):
            busy = threading.Lock()
            busy.acquire()
            ctx.extra["chain_bound"] = (key, blocks, task, busy)
    work = N * OH * OW * C1 * (9 + C0 + M)
    try:
        _chain_run(k.raw, blocks, x, z, y, work, I, sa or 0, task)
    finally:
        if busy is not None:
            busy.release()
    if ctx is not None and ctx.extra.get("chain_bound", (None,))[0] == key:
        ctx.extra["chain_fast"] = _chain_fast(ctx, (We, Be, Wd, Bd, Wp, Bp), X.shape,
                                              None if z is None else z.shape, y.shape, k.raw,
                                              work, None if I is None else I.shape)
    return y


def _chain_run(raw, blocks, x, z, y, work, other=None, sa=0, task=None):
    """``dwconv_avx2.chain`` on its call blocks with these arrays (one call here with the
    band buffers from this thread's workspace, or the blocks over the C block pool, ``task``
    (:class:`~workbench.ops.parallel.BlockTask`), with a buffer of the call's). ``other``
    (row stride ``sa``): the half the results are interleaved with."""
    dp = compiled.data_pointer
    px, py = dp(x), dp(y)
    pz = py if z is None else dp(z)
    pi = 0 if other is None else dp(other)

    for blk, _ in blocks:
        blk[0], blk[7], blk[8], blk[35], blk[38] = px, pz, py, pi, sa
    if len(blocks) == 1:
        # the band buffers: the calling thread's workspace, shared by every chain node (held
        # here while the kernel runs: past scratch's size it is a fresh array)
        blk, (ne, nd, npb, _packs) = blocks[0]
        ebuf = scratch(np, (ne,), _F32, slot="chain_expand")
        dbuf = scratch(np, (nd,), _F32, slot="chain_dw")
        pbuf = scratch(np, (npb,), _F32, slot="chain_project")
        blk[9], blk[10], blk[36] = dp(ebuf), dp(dbuf), dp(pbuf)
        raw(dp(blk))
        return
    # split over the pool: one buffer for the call, a part per range (not the pool threads'
    # workspaces: which thread takes which range changes from run to run, so those would be
    # made in whichever run first gives a thread a range, not in the first run)
    buf = np.empty(sum(sum(sizes[:3]) for _, sizes in blocks), _F32)
    at = dp(buf)
    for blk, (ne, nd, npb, _packs) in blocks:
        blk[9], blk[10], blk[36] = at, at + 4 * ne, at + 4 * (ne + nd)
        at += 4 * (ne + nd + npb)
    task(work)
    del buf


def _chain_fast(ctx, weights, x_shape, z_shape, y_shape, raw, work, i_shape):
    """The node's next runs with inputs like these: everything but the arrays' addresses
    checked once here (as NhwcConv's pre-bound call, :func:`_bound_call`): the same weight
    and bias arrays, unchanged (the packing's sample and bias bytes), X and Z of the same
    shapes, kernels on; else None (the full path runs, and binds again)."""
    _key, blocks, task, busy = ctx.extra["chain_bound"]
    checks = [(w_in, b_in, idx, sample, b_bytes) for w_in, b_in, idx, sample, b_bytes, _p in
              (ctx.extra[k] for k, w in zip(("chain_expand", "chain_dw", "chain_project"),
                                            weights[::2]) if w is not None)]
    enabled, empty = compiled.enabled, np.empty
    w0, w1, w2, w3, w4, w5 = weights

    def fast(X, We, Be, Wd, Bd, Wp, Bp, Z, I):  # noqa: E741
        if We is not w0 or Be is not w1 or Wd is not w2 or Bd is not w3 or Wp is not w4 \
                or Bp is not w5 or type(X) is not np.ndarray or X.shape != x_shape \
                or X.dtype is not _F32:
            return None
        if Z is None:
            if z_shape is not None:
                return None
        elif type(Z) is not np.ndarray or Z.shape != z_shape or Z.dtype is not _F32:
            return None
        sa = 0
        if I is None:
            if i_shape is not None:
                return None
        else:
            if type(I) is not np.ndarray or I.shape != i_shape or I.dtype is not _F32:
                return None
            sa = _row_stride(I)
            if sa is None:
                return None
        for w_in, b_in, idx, sample, b_bytes in checks:
            if _sample(w_in, idx) != sample or (b_bytes is not None
                                                and b_in.tobytes() != b_bytes):
                return None
        if not enabled() or not busy.acquire(False):
            return None
        try:
            y = empty(y_shape, _F32)
            _chain_run(raw, blocks, _contiguous(X), None if Z is None
                       else np.ascontiguousarray(Z), y, work, I, sa, task)
            return y
        finally:
            busy.release()
    return fast


def _chain_cost(r0, r1, H, W, C0, C1, M, OH, OW, S, pt):
    """Multiply-adds of ``dwconv_avx2.chain`` on output rows r0:r1 (rows of every image one
    after another): the expand stage computes every input row the range's 3x3 windows read
    (a range's first and last rows read rows of the ranges beside it, computed twice)."""
    cost = 0
    r = r0
    while r < r1:
        n = r // OH
        oa, ob = r - n * OH, min(OH, r1 - n * OH)
        ia, ib = max(0, oa * S - pt), min(H, (ob - 1) * S - pt + 3)
        cost += max(0, ib - ia) * W * C1 * C0 + (ob - oa) * OW * C1 * (9 + M)
        r = (n + 1) * OH
    return cost


def _chain_jobs(N, H, W, C0, C1, M, OH, OW, S, pt, nw):
    """Output row ranges of a split chain: equal ranges, as many as minimises the work of
    the busiest thread (ranges claimed in order by whichever thread is free; each range
    computes its border rows' expansion again, which on the small maps of batch 1 (7 or 14
    rows) makes 2 ranges per thread cost up to 1.9x the expand stage's work): 2 ranges per
    thread (a thread the OS runs late leaves less to the others) unless ``nw`` to ``4 * nw``
    ranges do clearly better."""
    rows = N * OH
    best = None
    for k in [2 * nw] + [k for k in range(nw, 4 * nw + 1) if k != 2 * nw]:
        step = -(-rows // k)
        jobs = [(r, min(rows, r + step)) for r in range(0, rows, step)]
        load = [0] * nw
        for r0, r1 in jobs:
            i = load.index(min(load))
            load[i] += _chain_cost(r0, r1, H, W, C0, C1, M, OH, OW, S, pt)
        span = max(load)
        if best is None or span < best[0] * 0.98:   # more ranges only for a clear gain
            best = (span, jobs)
    return best[1]


def _chain_blocks(g, packs, has_e, has_p, has_z, geom, clips, first=None):
    """The call blocks of ``dwconv_avx2.chain`` for output row ranges (one range unless the
    work is worth splitting over the pool), each with the sizes of its band buffers (given
    at each call, see :func:`_chain_run`). ``first``: None, or the results
    interleaved with another half (which takes the even channels when ``first``)."""
    N, H, W, C0, C1, M, OH, OW, S, pb = geom
    band = _chain_band(S, W, OW, C1)
    rows = N * OH
    work = rows * OW * C1 * (9 + (C0 if has_e else 0) + (M if has_p else 0))
    nw = n_workers()
    if nw > 1 and work >= _split_min():
        jobs = _chain_jobs(N, H, W, C0 if has_e else 0, C1, M if has_p else 0, OH, OW, S,
                           pb[0], nw)
    else:
        jobs = [(0, rows)]
    packs = list(packs)
    ew, eb = packs.pop(0) if has_e else (_ONE, _ONE)
    dw, db = packs.pop(0)
    pw, pbias = packs.pop(0) if has_p else (_ONE, _ONE)
    gemm = ctypes.cast(g.raw, ctypes.c_void_p).value
    dp = compiled.data_pointer
    (elo, ehi), (dlo, dhi), (plo, phi) = clips
    ne = ((band - 1) * S + 3) * W * C1 if has_e else 1   # floats of the band buffers
    nd = band * OW * C1 if has_p else 1
    npb = band * OW * M if has_p and first is not None else 1
    blocks = []
    for r0, r1 in jobs:
        blk = np.zeros(40, np.int64)
        blk[:12] = [0, dp(ew), dp(eb), dp(dw), dp(db), dp(pw), dp(pbias), 0, 0, 0, 0, gemm]
        blk[12:29] = [N, H, W, C0, C1, M, OH, OW, S, pb[0], pb[1], int(has_e), int(has_p),
                      int(has_z), band, r0, r1]
        blk.view(np.float64)[29:35] = [elo, ehi, dlo, dhi, plo, phi]
        # 35 the other half and 36 the projected band's buffer (per call), 37 has_i, 38 the
        # other half's row stride (per call), 39 i_first
        blk[37], blk[39] = int(first is not None), int(bool(first))
        # the packed weights are kept alive by the node's context (or by this list)
        blocks.append((blk, (ne, nd, npb, (ew, eb, dw, db, pw, pbias))))
    return blocks
