/* Depthwise 3x3 convolution on channels-last float32 activations, AVX2 + FMA (see
 * dwconv_avx2.py).
 *
 *   Y[n, oh, ow, c] = clip(bias[c] + sum_{i,j} X[n, oh*S - pt + i, ow*S - pl + j, c] * W[i, j, c]
 *                          + Z[n, oh, ow, c], lo, hi)     for output rows r0 <= n*OH + oh < r1
 *
 * X (N, H, W, C), Y and Z (N, OH, OW, C) are NHWC (channels contiguous). The weights were packed
 * once into (9, Cp) and the bias into (Cp,), Cp = C rounded up to 8, zeros past C, so weight and
 * bias loads never need a mask; the last channel block reads and writes X/Y/Z with masked
 * loads/stores. Taps outside the input (padding) are skipped, never multiplied by zero, so an
 * Inf or NaN next to the border does not leak into outputs that do not see it.
 *
 * Per output row, the interior pixels (every tap inside the input) run without bounds checks,
 * CHUNK x 8 channels at a time (independent FMA chains), with the set of kernel rows inside the
 * input a literal of an inlined copy (top and bottom border rows get their own); border pixels
 * (and rows of inputs shorter than the kernel) take the taps that fall inside one by one.
 *
 * The clip keeps NaN: max/min return their second operand when either is NaN, and the
 * accumulator is that operand. lo/hi = -inf/inf skip it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static const int32_t mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i lanes(int64_t n) {   /* the first n (0..8) lanes on */
    return _mm256_loadu_si256((const __m256i *)(mask_table + 8 - n));
}

/* The register tile: GROUP output pixels x CHUNK blocks of 8 channels (GROUP * CHUNK
 * accumulators). One pixel at a time, its channels in order, reads every input row as a few
 * ascending streams, which the hardware prefetchers follow: measured on AMD EPYC (AVX2), tiles
 * of 4 pixels x 16 channels were 1.1-1.5x faster on stride-1 layers that stay in cache (batch
 * 1) but up to 2x slower on layers read from memory (batch 8, and stride 2), software
 * prefetching did not recover it, and they took 3-7x longer to compile. */
#ifndef GROUP
#define GROUP 1
#endif
#ifndef CHUNK
#define CHUNK 4
#endif
#define LOAD(p) (MASKED ? _mm256_maskload_ps((p), m) : _mm256_loadu_ps(p))

/* the call's arguments, one int64 block (19 slots): a ctypes call costs ~0.4 us per argument,
 * so the engine keeps a block per node and call range and rewrites only the array pointers */
typedef struct {
    const float *x, *wp, *bp, *z;
    float *y;
    int64_t N, H, W, C, OH, OW, S, pt, pl, has_z, r0, r1;
    double lo, hi;
} call_t;

/* bias + Z, clip, store: the epilogue of one output vector */
static inline __attribute__((always_inline)) void finish(
        const int MASKED, __m256 acc, const float *z, float *y, int has_z, int clip,
        __m256 lo, __m256 hi, __m256i m) {
    if (has_z)
        acc = _mm256_add_ps(acc, LOAD(z));
    if (clip) {
        acc = _mm256_max_ps(lo, acc);
        acc = _mm256_min_ps(hi, acc);
    }
    if (MASKED)
        _mm256_maskstore_ps(y, m, acc);
    else
        _mm256_storeu_ps(y, acc);
}

/* one border pixel of one channel block: the taps inside the input, weights from memory
 * (not inlined: one copy for full blocks, one for the masked tail) */
#define BORDER(NAME, MK)                                                                    \
    static __attribute__((noinline)) void NAME(                                              \
            const float *x, const float *wp, __m256 bias, const float *z, float *y,          \
            int64_t ih0, int64_t iw0, int64_t H, int64_t W, int64_t C, int64_t Cp,           \
            int has_z, int clip, __m256 lo, __m256 hi, __m256i m) {                          \
        const int MASKED = MK;                                                               \
        __m256 acc = bias;                                                                   \
        for (int64_t i = 0; i < 3; i++) {                                                    \
            const int64_t ih = ih0 + i;                                                      \
            if (ih < 0 || ih >= H)                                                           \
                continue;                                                                    \
            for (int64_t j = 0; j < 3; j++) {                                                \
                const int64_t iw = iw0 + j;                                                  \
                if (iw < 0 || iw >= W)                                                       \
                    continue;                                                                \
                acc = _mm256_fmadd_ps(LOAD(x + (ih * W + iw) * C),                           \
                                      _mm256_loadu_ps(wp + (i * 3 + j) * Cp), acc);          \
            }                                                                                \
        }                                                                                    \
        finish(MASKED, acc, z, y, has_z, clip, lo, hi, m);                                   \
    }
BORDER(border_full, 0)
BORDER(border_masked, 1)
#undef BORDER

/* GROUP consecutive interior output pixels (every tap inside the input) x CB blocks of 8
 * channels: p points at the first pixel's window start (input row ih0, channel offset
 * included); kernel rows I0 <= i < I1 lie inside the input (literals: one inlined copy per
 * case); MT: the last block is the masked channel tail. GROUP * CB accumulators (independent
 * FMA chains), each weight vector loaded once for the GROUP pixels. */
static inline __attribute__((always_inline)) void pixels(
        const int CB, const int MT, const int I0, const int I1, const int S, const float *p,
        const float *wp, const float *bp, const float *z, float *y, int64_t rs, int64_t C,
        int64_t Cp, int has_z, int clip, __m256 lo, __m256 hi, __m256i m) {
    __m256 acc[GROUP][CB];
#pragma GCC unroll 8
    for (int q = 0; q < GROUP; q++)
#pragma GCC unroll 4
        for (int k = 0; k < CB; k++)
            acc[q][k] = _mm256_loadu_ps(bp + 8 * k);
    const int64_t ps = S * C;
#define LD(ptr, MK) ((MK) ? _mm256_maskload_ps((ptr), m) : _mm256_loadu_ps(ptr))
#pragma GCC unroll 3
    for (int i = I0; i < I1; i++) {
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) {
            const float *t = p + i * rs + j * C;
#pragma GCC unroll 4
            for (int k = 0; k < CB; k++) {
                const __m256 w = _mm256_loadu_ps(wp + (i * 3 + j) * Cp + 8 * k);
                const int mk = MT && k == CB - 1;
#pragma GCC unroll 8
                for (int q = 0; q < GROUP; q++)
                    acc[q][k] = _mm256_fmadd_ps(LD(t + q * ps + 8 * k, mk), w, acc[q][k]);
            }
        }
    }
#undef LD
#pragma GCC unroll 8
    for (int q = 0; q < GROUP; q++)
#pragma GCC unroll 4
        for (int k = 0; k < CB; k++)
            finish(MT && k == CB - 1, acc[q][k], z + q * C + 8 * k, y + q * C + 8 * k, has_z,
                   clip, lo, hi, m);
}

/* GROUP interior pixels starting at output column ow, every channel (8 * CHUNK at a time) */
static inline __attribute__((always_inline)) void pixel_group(
        const int I0, const int I1, const int S, const float *xr, const float *wp,
        const float *bp, const float *zr, float *yr, int64_t ow, int64_t pl, int64_t rs,
        int64_t C, int64_t Cp, int has_z, int clip, __m256 lo, __m256 hi, __m256i all,
        __m256i tail) {
    const float *p = xr + (ow * S - pl) * C;
    const float *z = zr + (has_z ? ow * C : 0);
    float *y = yr + ow * C;
    int64_t c = 0;
#define P(CB, MT, M) pixels(CB, MT, I0, I1, S, p + c, wp + c, bp + c, z + c, y + c, rs, C, Cp, \
                            has_z, clip, lo, hi, M)
    for (; c + 8 * CHUNK <= C; c += 8 * CHUNK)
        P(CHUNK, 0, all);
#if CHUNK != 4
#error "the channel tail below is written for CHUNK == 4"
#endif
    switch ((C - c + 7) / 8) {   /* the channel tail: 1-4 blocks in one tile, the last masked */
    case 4: P(4, 1, (C & 7) ? tail : all); break;
    case 3: P(3, 1, (C & 7) ? tail : all); break;
    case 2: P(2, 1, (C & 7) ? tail : all); break;
    case 1: P(1, 1, (C & 7) ? tail : all); break;
    default: break;
    }
#undef P
}

/* one output row: xr points at input row ih0 (it may lie outside; only the rows I0..I1-1
 * of the window are read), yr/zr at the output row; the valid kernel rows I0..I1-1 are
 * literals (I1 <= I0: the generic row, every pixel tap by tap) */
static inline __attribute__((always_inline)) void row(
        const int I0, const int I1, const int S, const float *xr, const float *wp,
        const float *bp, const float *zr, float *yr, int64_t ih0, int64_t H, int64_t W,
        int64_t C, int64_t Cp, int64_t OW, int64_t pl, int64_t ow_lo, int64_t ow_hi,
        int has_z, int clip, __m256 lo, __m256 hi) {
    const __m256i all = lanes(8), tail = lanes(C & 7);
    const int64_t rs = W * C;
    const float *img = xr - ih0 * rs;
    if (I1 <= I0)
        ow_lo = ow_hi = OW;
    int64_t ow = 0;
#define BORDER_PIXEL                                                                        \
    {                                                                                       \
        const int64_t zo = has_z ? ow * C : 0;                                              \
        int64_t c = 0;                                                                      \
        for (; c + 8 <= C; c += 8)                                                          \
            border_full(img + c, wp + c, _mm256_loadu_ps(bp + c), zr + zo + c,              \
                        yr + ow * C + c, ih0, ow * S - pl, H, W, C, Cp, has_z, clip, lo,    \
                        hi, all);                                                           \
        if (c < C)                                                                          \
            border_masked(img + c, wp + c, _mm256_loadu_ps(bp + c), zr + zo + c,            \
                          yr + ow * C + c, ih0, ow * S - pl, H, W, C, Cp, has_z, clip, lo,  \
                          hi, tail);                                                        \
    }
    for (; ow < ow_lo; ow++)
        BORDER_PIXEL
#define G(OW0) pixel_group(I0, I1, S, xr, wp, bp, zr, yr, OW0, pl, rs, C, Cp, has_z, clip, \
                          lo, hi, all, tail)
    if (ow_hi - ow >= GROUP) {
        for (; ow + GROUP <= ow_hi; ow += GROUP)
            G(ow);
        if (ow < ow_hi) {   /* the last few: a group shifted left (a few pixels twice) */
            G(ow_hi - GROUP);
            ow = ow_hi;
        }
    }
#undef G
    for (; ow < OW; ow++)   /* the right border (and interior pixels of a short row) */
        BORDER_PIXEL
#undef BORDER_PIXEL
}

static inline __attribute__((always_inline)) void rows(
        const int S, const float *x, const float *wp, const float *bp, const float *z,
        float *y, const call_t *g, int64_t r0, int64_t r1, int has_z, int clip, __m256 lo,
        __m256 hi) {
    const int64_t H = g->H, W = g->W, C = g->C, OH = g->OH, OW = g->OW, pt = g->pt,
                  pl = g->pl, Cp = (C + 7) / 8 * 8;
    /* interior columns: ow_lo <= ow < ow_hi have every tap inside (iw0 >= 0, iw0 + 3 <= W) */
    int64_t ow_lo = (pl + S - 1) / S, ow_hi = W - 3 + pl >= 0 ? (W - 3 + pl) / S + 1 : 0;
    if (ow_lo > OW)
        ow_lo = OW;
    if (ow_hi > OW)
        ow_hi = OW;
    if (ow_hi < ow_lo)
        ow_hi = ow_lo;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t n = r / OH, oh = r - n * OH, ih0 = oh * S - pt;
        const float *xr = x + ((n * H) + ih0) * W * C;
        float *yr = y + r * OW * C;
        const float *zr = has_z ? z + r * OW * C : z;
        const int64_t i0 = ih0 < 0 ? -ih0 : 0, i1 = H - ih0 < 3 ? H - ih0 : 3;
#define R(I0, I1) row(I0, I1, S, xr, wp, bp, zr, yr, ih0, H, W, C, Cp, OW, pl, ow_lo, ow_hi, \
                      has_z, clip, lo, hi)
        if (i0 == 0 && i1 == 3) R(0, 3);
        else if (i0 == 1 && i1 == 3) R(1, 3);   /* a top border row */
        else if (i0 == 0 && i1 == 2) R(0, 2);   /* a bottom one */
        else R(0, 0);   /* H < 3 or pads >= 2: every pixel tap by tap */
#undef R
    }
}

/* Y rows a->r0 .. a->r1-1 (r = n*OH + oh) of the call block a: wp (9, Cp) and bp (Cp,)
 * packed and zero-padded; Z read only when has_z; lo/hi = -inf/inf: no clip. S is 1 or 2
 * (else nothing is written: the caller runs another path). */
void wb_dwconv_avx2_dw3x3(const int64_t *block) {
    const call_t *a = (const call_t *)block;
    if (a->r1 <= a->r0 || a->C <= 0 || a->OW <= 0)
        return;
    const float lo = (float)a->lo, hi = (float)a->hi;
    const int clip = !(isinf(lo) && lo < 0 && isinf(hi) && hi > 0);
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const int hz = a->has_z != 0;
    if (a->S == 1)
        rows(1, a->x, a->wp, a->bp, a->z, a->y, a, a->r0, a->r1, hz, clip, vlo, vhi);
    else if (a->S == 2)
        rows(2, a->x, a->wp, a->bp, a->z, a->y, a, a->r0, a->r1, hz, clip, vlo, vhi);
}

/* ---------------------------------------------------------------------------------------------
 * Max pool on channels-last float32 activations (see dwconv_avx2.py, ``maxpool``):
 *
 *   Y[n, oh, ow, c] = max over the taps (i, j) inside the input of
 *                     X[n, oh*SH - pt + i*DH, ow*SW - pl + j*DW, c]
 *
 * for output rows r0 <= n*OH + oh < r1; a window with no tap inside the input gives -inf (the
 * numpy path's identity). NaN propagates as numpy's ``maximum`` does: the result is NaN when any
 * tap of the window is NaN (tracked with an unordered compare, as max_ps alone keeps only one of
 * its operands' NaN).
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    float *y;
    int64_t N, H, W, C, OH, OW, KH, KW, SH, SW, DH, DW, pt, pl, r0, r1;
} pool_t;

#define PCHUNK 4

static inline __attribute__((always_inline)) void pool_pixel(
        const float *xr0, float *yp, int64_t C, int64_t i0, int64_t i1,
        int64_t j0, int64_t j1, int64_t DHWC, int64_t DWC) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), qnan = _mm256_set1_ps(NAN);
    int64_t c = 0;
    for (; c + 8 * PCHUNK <= C; c += 8 * PCHUNK) {
        __m256 acc[PCHUNK], bad[PCHUNK];
        for (int u = 0; u < PCHUNK; u++) {
            acc[u] = ninf;
            bad[u] = _mm256_setzero_ps();
        }
        for (int64_t i = i0; i < i1; i++) {
            const float *xi = xr0 + i * DHWC + c;
            for (int64_t j = j0; j < j1; j++) {
                const float *p = xi + j * DWC;
                for (int u = 0; u < PCHUNK; u++) {
                    const __m256 v = _mm256_loadu_ps(p + 8 * u);
                    acc[u] = _mm256_max_ps(acc[u], v);
                    bad[u] = _mm256_or_ps(bad[u], _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                }
            }
        }
        for (int u = 0; u < PCHUNK; u++)
            _mm256_storeu_ps(yp + c + 8 * u, _mm256_blendv_ps(acc[u], qnan, bad[u]));
    }
    for (; c + 8 <= C; c += 8) {
        __m256 acc = ninf, bad = _mm256_setzero_ps();
        for (int64_t i = i0; i < i1; i++) {
            const float *xi = xr0 + i * DHWC + c;
            for (int64_t j = j0; j < j1; j++) {
                const __m256 v = _mm256_loadu_ps(xi + j * DWC);
                acc = _mm256_max_ps(acc, v);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            }
        }
        _mm256_storeu_ps(yp + c, _mm256_blendv_ps(acc, qnan, bad));
    }
    /* the last C % 8 channels one by one: masked stores are slow on AMD (microcoded) */
    for (; c < C; c++) {
        float acc = -INFINITY;
        int bad = 0;
        for (int64_t i = i0; i < i1; i++) {
            const float *xi = xr0 + i * DHWC + c;
            for (int64_t j = j0; j < j1; j++) {
                const float v = xi[j * DWC];
                acc = v > acc ? v : acc;
                bad |= v != v;
            }
        }
        yp[c] = bad ? NAN : acc;
    }
}

/* Y rows a->r0 .. a->r1-1 (r = n*OH + oh) of the call block a (strides, dilations >= 1). */
void wb_dwconv_avx2_maxpool(const int64_t *block) {
    const pool_t *a = (const pool_t *)block;
    const int64_t H = a->H, W = a->W, C = a->C, OH = a->OH, OW = a->OW, KH = a->KH,
                  KW = a->KW, SH = a->SH, SW = a->SW, DH = a->DH, DW = a->DW, pt = a->pt,
                  pl = a->pl;
    if (a->r1 <= a->r0 || C <= 0 || OW <= 0 || SH < 1 || SW < 1 || DH < 1 || DW < 1)
        return;
    for (int64_t r = a->r0; r < a->r1; r++) {
        const int64_t n = r / OH, oh = r - n * OH, ih0 = oh * SH - pt;
        /* kernel rows i with 0 <= ih0 + i*DH < H */
        int64_t i0 = ih0 < 0 ? (-ih0 + DH - 1) / DH : 0;
        int64_t i1 = H - ih0 > 0 ? (H - ih0 + DH - 1) / DH : 0;
        if (i1 > KH)
            i1 = KH;
        if (i1 < i0)
            i1 = i0;
        const float *xn = a->x + (n * H + ih0) * W * C;   /* row ih0 (maybe outside) */
        float *yr = a->y + r * OW * C;
        for (int64_t ow = 0; ow < OW; ow++) {
            const int64_t iw0 = ow * SW - pl;
            int64_t j0 = iw0 < 0 ? (-iw0 + DW - 1) / DW : 0;
            int64_t j1 = W - iw0 > 0 ? (W - iw0 + DW - 1) / DW : 0;
            if (j1 > KW)
                j1 = KW;
            if (j1 < j0)
                j1 = j0;
            pool_pixel(xn + iw0 * C, yr + ow * C, C, i0, i1, j0, j1, DH * W * C, DW * C);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Channel interleave (see dwconv_avx2.py, ``interleave2``): ShuffleNet's concat of two
 * channels-last halves shuffled across 2 groups,
 *
 *   Y[p, 2j] = A[p*sa + j],  Y[p, 2j + 1] = B[p*sb + j]     for pixels p0 <= p < p1, j < c
 *
 * with A and B rows of c 4-byte values at element strides sa and sb (a channel slice of a
 * wider tensor is read in place) and Y (P, 2c) contiguous. Values are moved, never computed:
 * every bit pattern (NaN payloads, any 4-byte dtype) is copied as it is.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const float *a, *b;
    float *y;
    int64_t c, sa, sb, p0, p1;
} inter_t;

void wb_dwconv_avx2_interleave2(const int64_t *block) {
    const inter_t *g = (const inter_t *)block;
    const int64_t c = g->c, sa = g->sa, sb = g->sb;
    if (c <= 0)
        return;
    for (int64_t p = g->p0; p < g->p1; p++) {
        const float *ap = g->a + p * sa, *bp = g->b + p * sb;
        float *yp = g->y + p * 2 * c;
        int64_t j = 0;
        for (; j + 8 <= c; j += 8) {
            const __m256 va = _mm256_loadu_ps(ap + j), vb = _mm256_loadu_ps(bp + j);
            const __m256 lo = _mm256_unpacklo_ps(va, vb), hi = _mm256_unpackhi_ps(va, vb);
            _mm256_storeu_ps(yp + 2 * j, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(yp + 2 * j + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        }
        /* the tail as 32-bit integers: a float copy could quiet a signalling NaN */
        const int32_t *ai = (const int32_t *)ap, *bi = (const int32_t *)bp;
        int32_t *yi = (int32_t *)yp;
        for (; j < c; j++) {
            yi[2 * j] = ai[j];
            yi[2 * j + 1] = bi[j];
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * An inverted-residual chain per band of output rows (see dwconv_avx2.py, ``chain``):
 *
 *   E = clip(X @ We + be)              (1x1 expand, when has_e; else E is X)
 *   D = clip(depthwise3x3(E) + bd)     (stride S, pads pt/pl, as wb_dwconv_avx2_dw3x3)
 *   Y = clip(D @ Wp + bp + Z)          (1x1 project, when has_p; else Y is D)
 *
 * for output rows r0 <= n*OH + oh < r1, ``band`` output rows at a time: the band's input rows
 * of E (and its D rows) live in small scratch buffers (L2) instead of whole tensors that go
 * to memory and back. E rows shared with the next band (the 3 - S rows of the window's
 * overlap) are moved to the buffer's front, not computed again. The 1x1 products are the GEMM
 * of gemm_avx2 (its address in the block: this module only calls it), the depthwise stage is
 * wb_dwconv_avx2_dw3x3 on the band as an image of its own rows; every value is computed by the
 * same instructions in the same order as by the three layers run one after another, so the
 * results are the same bits. ebuf holds (band-1)*S + 3 rows of W x C1, dbuf band x OW x C1.
 * With has_i (and has_p) the band's projected rows go to pbuf and are interleaved with the
 * other half ia into Y as ``interleave2`` does (ShuffleNet's concat + channel shuffle after
 * a branch): Y (N, OH, OW, 2M) never holds the branch's own output.
 */
typedef void (*gemm_fn)(const float *, const float *, const float *, const float *, float *,
                        int64_t, int64_t, int64_t, int64_t, int64_t, float, float);

typedef struct {
    const float *x, *ew, *eb, *dw, *db, *pw, *pb, *z;
    float *y, *ebuf, *dbuf;
    gemm_fn gemm;
    int64_t N, H, W, C0, C1, M, OH, OW, S, pt, pl, has_e, has_p, has_z, band, r0, r1;
    double elo, ehi, dlo, dhi, plo, phi;
    const float *ia;   /* has_i: the other half of a 2-group concat + shuffle (NHWC rows of M
                        * values sa apart); Y then has 2M channels, interleaved */
    float *pbuf;       /* has_i: the band's projected rows, band x OW x M */
    int64_t has_i, sa, i_first;   /* i_first: ia's values take the even channels */
} chain_t;

void wb_dwconv_avx2_chain(const int64_t *block) {
    const chain_t *a = (const chain_t *)block;
    const int64_t H = a->H, W = a->W, C0 = a->C0, C1 = a->C1, M = a->M, OH = a->OH,
                  OW = a->OW, S = a->S, pt = a->pt, band = a->band;
    if (a->r1 <= a->r0 || OH <= 0 || OW <= 0 || C1 <= 0 || band <= 0 || (S != 1 && S != 2)
            || (a->has_e && C0 <= 0) || (a->has_p && M <= 0))
        return;
    const float elo = (float)a->elo, ehi = (float)a->ehi;
    const float plo = (float)a->plo, phi = (float)a->phi;
    const int64_t rowe = W * C1;   /* floats of one E row */
    int64_t cur = -1, have_lo = 0, have_hi = 0;   /* E rows have_lo .. have_hi-1 of image cur */
    for (int64_t r = a->r0; r < a->r1;) {
        const int64_t n = r / OH, oa = r - n * OH;
        int64_t ob = oa + band;
        if (ob > OH)
            ob = OH;
        if (ob > a->r1 - n * OH)
            ob = a->r1 - n * OH;
        int64_t ia = oa * S - pt, ib = (ob - 1) * S - pt + 3;
        if (ia < 0)
            ia = 0;
        if (ib > H)
            ib = H;
        if (ib <= ia) {   /* every tap in padding (pads >= 3): no input row */
            ia = 0;
            ib = 0;
        }
        const float *src;
        if (a->has_e) {
            int64_t start = ia;
            if (cur == n && ia >= have_lo && ia < have_hi && have_hi <= ib) {
                memmove(a->ebuf, a->ebuf + (ia - have_lo) * rowe,
                        (size_t)((have_hi - ia) * rowe) * sizeof(float));
                start = have_hi;
            }
            if (ib > start)
                a->gemm(a->x + (n * H + start) * W * C0, a->ew, a->eb, a->ebuf,
                        a->ebuf + (start - ia) * rowe, C0, C1, 0, (ib - start) * W, 0, elo,
                        ehi);
            cur = n;
            have_lo = ia;
            have_hi = ib;
            src = a->ebuf;
        } else {
            src = a->x + (n * H + ia) * W * C1;
        }
        float *out = a->has_p ? a->dbuf : a->y + (n * OH + oa) * OW * C1;
        call_t d;
        d.x = src;
        d.wp = a->dw;
        d.bp = a->db;
        d.z = src;
        d.y = out;
        d.N = 1;
        d.H = ib - ia;
        d.W = W;
        d.C = C1;
        d.OH = ob - oa;
        d.OW = OW;
        d.S = S;
        d.pt = pt - (oa * S - ia);
        d.pl = a->pl;
        d.has_z = 0;
        d.r0 = 0;
        d.r1 = ob - oa;
        d.lo = a->dlo;
        d.hi = a->dhi;
        wb_dwconv_avx2_dw3x3((const int64_t *)&d);
        if (a->has_p) {
            const int64_t o = (n * OH + oa) * OW * M;
            float *dst = a->has_i ? a->pbuf : a->y + o;
            a->gemm(a->dbuf, a->pw, a->pb, a->has_z ? a->z + o : a->dbuf, dst, C1, M, 0,
                    (ob - oa) * OW, a->has_z, plo, phi);
            if (a->has_i) {   /* the band's pixels interleaved with the other half into Y */
                const float *other = a->ia + (n * OH + oa) * OW * a->sa;
                inter_t il;
                il.a = a->i_first ? other : a->pbuf;
                il.b = a->i_first ? a->pbuf : other;
                il.y = a->y + (n * OH + oa) * OW * 2 * M;
                il.c = M;
                il.sa = a->i_first ? a->sa : M;
                il.sb = a->i_first ? M : a->sa;
                il.p0 = 0;
                il.p1 = (ob - oa) * OW;
                wb_dwconv_avx2_interleave2((const int64_t *)&il);
            }
        }
        r = n * OH + ob;
    }
}

/* ---------------------------------------------------------------------------------------------
 * A convolution with few input channels (group 1, C <= 4: a network's stem on RGB images),
 * see dwconv_avx2.py, ``fewc``:
 *
 *   Y[n, oh, ow, m] = clip(sum_{i,j,c} X[n, oh*SH - pt + i, ow*SW - pl + j, c] * W[i, j, c, m]
 *                          + bias[m] + Z[n, oh, ow, m], lo, hi)
 *
 * X is read through element strides (sn, sh, sw, sc): the layout pass' NHWC view of an NCHW
 * input needs no copy. W packed as (KH*KW*C, Mp) and bias as (Mp,), Mp = M rounded up to 8,
 * zeros past M. Each output is one FMA chain over the taps in (i, j, c) order from zero, then
 * bias, Z and the clip; taps in the padding read 0 (as a zero-padded input: 0 * Inf is NaN).
 * A register tile of P pixels x NV vectors of 8 output channels (P*NV <= 12 accumulators),
 * the input value broadcast once per pixel and tap, each weight vector loaded once per tap
 * for the P pixels.
 */
typedef struct {
    const float *x, *w, *b, *z;
    float *y;
    int64_t N, H, W, C, OH, OW, M, KH, KW, SH, SW, pt, pl, sn, sh, sw, sc, has_z, r0, r1;
    double lo, hi;
} fewc_t;

/* the epilogue of one output vector at y[o] (channels m0 .. m0+7, masked when mk): + bias,
 * + residual (has_z), clip, store */
static inline __attribute__((always_inline)) void fewc_store(
        const fewc_t *a, __m256 acc, int64_t o, int64_t m0, const float *zr, float *yr,
        int clip, __m256 lo, __m256 hi, __m256i tail, int mk) {
    acc = _mm256_add_ps(acc, _mm256_loadu_ps(a->b + m0));
    if (a->has_z)
        acc = _mm256_add_ps(acc, mk ? _mm256_maskload_ps(zr + o, tail) : _mm256_loadu_ps(zr + o));
    if (clip) {
        acc = _mm256_max_ps(lo, acc);
        acc = _mm256_min_ps(hi, acc);
    }
    if (mk)
        _mm256_maskstore_ps(yr + o, tail, acc);
    else
        _mm256_storeu_ps(yr + o, acc);
}

/* one output value vector: pixel ow of row oh, channels m0 .. m0+7 (masked when mk), taps
 * outside the input read as 0 (border pixels, and the few interior ones past the tiles) */
static __attribute__((noinline)) void fewc_pixel(
        const fewc_t *a, const float *xn, int64_t oh, int64_t ow, int64_t m0, const float *zr,
        float *yr, int clip, __m256 lo, __m256 hi, __m256i tail, int mk) {
    const int64_t C = a->C, KH = a->KH, KW = a->KW, Mp = (a->M + 7) / 8 * 8;
    const int64_t ih0 = oh * a->SH - a->pt, iw0 = ow * a->SW - a->pl;
    const float *wr = a->w + m0;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < KH; i++) {
        const int64_t ih = ih0 + i;
        const int rin = ih >= 0 && ih < a->H;
        for (int64_t j = 0; j < KW; j++) {
            const int64_t iw = iw0 + j;
            const int in = rin && iw >= 0 && iw < a->W;
            for (int64_t c = 0; c < C; c++, wr += Mp) {
                const float v = in ? xn[ih * a->sh + iw * a->sw + c * a->sc] : 0.0f;
                acc = _mm256_fmadd_ps(_mm256_set1_ps(v), _mm256_loadu_ps(wr), acc);
            }
        }
    }
    fewc_store(a, acc, ow * a->M + m0, m0, zr, yr, clip, lo, hi, tail, mk);
}

/* P interior pixels (every tap inside the input) from column ow of output row oh (image
 * xn), the NV vectors of channels from m0 (the last masked when mk) */
static inline __attribute__((always_inline)) void fewc_tile(
        const int P, const int NV, const fewc_t *a, const float *xn,
        int64_t oh, int64_t ow, int64_t m0, const float *zr, float *yr, int clip, __m256 lo,
        __m256 hi, __m256i tail, int mk) {
    const int64_t C = a->C, KH = a->KH, KW = a->KW, Mp = (a->M + 7) / 8 * 8, M = a->M;
    const int64_t sh = a->sh, sw = a->sw, sc = a->sc;
    const int64_t ih0 = oh * a->SH - a->pt;
    __m256 acc[6][4];
#pragma GCC unroll 6
    for (int q = 0; q < P; q++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[q][v] = _mm256_setzero_ps();
    const float *wr = a->w + m0;
    {
        const float *base[6];
#pragma GCC unroll 6
        for (int q = 0; q < P; q++)
            base[q] = xn + ih0 * sh + ((ow + q) * a->SW - a->pl) * sw;
        for (int64_t i = 0; i < KH; i++)
            for (int64_t j = 0; j < KW; j++) {
                const int64_t o0 = i * sh + j * sw;
                for (int64_t c = 0; c < C; c++, wr += Mp) {
                    const int64_t o = o0 + c * sc;
                    __m256 wv[4];
#pragma GCC unroll 4
                    for (int v = 0; v < NV; v++)
                        wv[v] = _mm256_loadu_ps(wr + 8 * v);
#pragma GCC unroll 6
                    for (int q = 0; q < P; q++) {
                        const __m256 xb = _mm256_broadcast_ss(base[q] + o);
#pragma GCC unroll 4
                        for (int v = 0; v < NV; v++)
                            acc[q][v] = _mm256_fmadd_ps(xb, wv[v], acc[q][v]);
                    }
                }
            }
    }
#pragma GCC unroll 6
    for (int q = 0; q < P; q++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            fewc_store(a, acc[q][v], (ow + q) * M + m0 + 8 * v, m0 + 8 * v, zr, yr, clip,
                       lo, hi, tail, mk && v == NV - 1);
        }
}

/* one output row, channels m0 .. m0 + 8*NV - 1: border pixels one by one, interior ones P at
 * a time (P * NV <= 12 accumulators; 3 x 3 measured faster than 4 x 3 on AMD EPYC) */
static inline __attribute__((always_inline)) void fewc_cols(
        const int P, const int NV, const fewc_t *a, const float *xn, int64_t oh, int rows_in,
        int64_t ow_lo, int64_t ow_hi, int64_t m0, const float *zr, float *yr, int clip,
        __m256 lo, __m256 hi, __m256i tail, int mk) {
    int64_t ow = 0;
#define PIXEL                                                                               \
    for (int v = 0; v < NV; v++)                                                            \
        fewc_pixel(a, xn, oh, ow, m0 + 8 * v, zr, yr, clip, lo, hi, tail, mk && v == NV - 1);
    if (rows_in) {
        for (; ow < ow_lo; ow++)
            PIXEL
        for (; ow + P <= ow_hi; ow += P)
            fewc_tile(P, NV, a, xn, oh, ow, m0, zr, yr, clip, lo, hi, tail, mk);
    }
    for (; ow < a->OW; ow++)
        PIXEL
#undef PIXEL
}

void wb_dwconv_avx2_fewc(const int64_t *block) {
    const fewc_t *a = (const fewc_t *)block;
    const int64_t OH = a->OH, OW = a->OW, M = a->M, W = a->W, KW = a->KW, SW = a->SW,
                  pl = a->pl;
    if (a->r1 <= a->r0 || OW <= 0 || M <= 0 || a->C <= 0 || a->C > 4 || a->KH <= 0
            || KW <= 0 || a->SH <= 0 || SW <= 0)
        return;
    const float lo = (float)a->lo, hi = (float)a->hi;
    const int clip = !(isinf(lo) && lo < 0 && isinf(hi) && hi > 0);
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const __m256i tail = lanes(M & 7);
    /* columns whose taps are all inside: ow_lo <= ow < ow_hi */
    int64_t ow_lo = (pl + SW - 1) / SW, ow_hi = W - KW + pl >= 0 ? (W - KW + pl) / SW + 1 : 0;
    if (ow_lo > OW)
        ow_lo = OW;
    if (ow_hi > OW)
        ow_hi = OW;
    if (ow_hi < ow_lo)
        ow_hi = ow_lo;
    for (int64_t r = a->r0; r < a->r1; r++) {
        const int64_t n = r / OH, oh = r - n * OH, ih0 = oh * a->SH - a->pt;
        const float *xn = a->x + n * a->sn;
        float *yr = a->y + r * OW * M;
        const float *zr = a->has_z ? a->z + r * OW * M : a->z;
        const int rows_in = ih0 >= 0 && ih0 + a->KH <= a->H;
#define COLS(P, NV, MK) fewc_cols(P, NV, a, xn, oh, rows_in, ow_lo, ow_hi, m0, zr, yr, clip, \
                                  vlo, vhi, tail, MK)
        int64_t m0 = 0;
        /* whole blocks of 32 channels: 3 pixels x 4 vectors */
        for (; m0 + 32 <= M; m0 += 32)
            COLS(3, 4, 0);
        if (m0 < M) {   /* the rest: 1-4 vectors, the last masked when M % 8 */
            const int nv = (int)((M - m0 + 7) / 8), mk = (M & 7) != 0;
            if (nv == 4)
                COLS(3, 4, mk);
            else if (nv == 3)
                COLS(3, 3, mk);
            else if (nv == 2)
                COLS(6, 2, mk);
            else
                COLS(6, 1, mk);
        }
#undef COLS
    }
}
