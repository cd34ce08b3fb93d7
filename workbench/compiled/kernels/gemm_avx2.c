/* Skinny float32 GEMM for channels-last 1x1 convolutions, AVX2 + FMA (see gemm_avx2.py).
 *
 *   Y[r, m] = clip(sum_k A[r, k] * B[k, m] + bias[m] + Z[r, m], lo, hi)   for r0 <= r < r1
 *
 * A (rows, K) and Y, Z (rows, M) are row-major and read/written in place (NHWC activations:
 * one row per pixel, channels contiguous). B was packed once, at prepare, into column panels
 * of 16: panel p is K rows of 16 floats (columns 16p .. 16p+15, zeros past M), panels one
 * after another; bias is padded with zeros to a multiple of 16 too. A register tile of 6
 * rows x 16 columns (12 ymm accumulators) runs over the whole K: per k, two loads of the
 * packed panel, six broadcasts of A and twelve FMAs. Tails: columns past M are computed from
 * the zero padding and never stored (masked stores), a last panel of <= 8 columns uses one
 * ymm per row (and, after a full panel, goes with it in tiles of 4 rows x 24 columns),
 * and the last rows (< 6) use a tile of that many rows. Rows are taken in blocks
 * whose A part stays in L2 while every panel passes over it.
 *
 * The clip keeps NaN: max/min return their second operand when either is NaN, and the
 * accumulator is that operand. lo/hi = -inf/inf skip it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MR 6
#define NR 16
#ifndef MC_SMALL_B
#define MC_SMALL_B 24576
#endif
#ifndef MC_A
#define MC_A 32768
#endif

static const int32_t mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i lanes(int64_t n) {   /* the first n (0..8) lanes on */
    return _mm256_loadu_si256((const __m256i *)(mask_table + 8 - n));
}

static inline __attribute__((always_inline)) __m256 finish(
        __m256 acc, const float *z, __m256 b, int has_z, int clip, __m256 lo, __m256 hi,
        int64_t n) {
    acc = _mm256_add_ps(acc, b);
    if (has_z)
        acc = _mm256_add_ps(acc, n >= 8 ? _mm256_loadu_ps(z) : _mm256_maskload_ps(z, lanes(n)));
    if (clip) {
        acc = _mm256_max_ps(lo, acc);
        acc = _mm256_min_ps(hi, acc);
    }
    return acc;
}

static inline __attribute__((always_inline)) void put(float *y, __m256 v, int64_t n) {
    if (n >= 8)
        _mm256_storeu_ps(y, v);
    else
        _mm256_maskstore_ps(y, lanes(n), v);
}

/* one tile: mr (1..6) rows from a, nv (1 or 2) vectors of the panel bp, ncols valid columns */
static inline __attribute__((always_inline)) void tile(
        const int mr, const int nv, const float *a, int64_t K, const float *bp,
        const float *bias, const float *z, float *y, int64_t M, int64_t ncols,
        int has_z, int clip, __m256 lo, __m256 hi) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
           c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a0 = a, *a1 = a + K, *a2 = a + 2 * K, *a3 = a + 3 * K, *a4 = a + 4 * K,
                *a5 = a + 5 * K;
#define STEP(i, ai)                                                        \
    if (mr > i) {                                                          \
        __m256 av = _mm256_broadcast_ss(ai + k);                           \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                        \
        if (nv > 1) c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);            \
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + k * NR);
        __m256 b1 = nv > 1 ? _mm256_loadu_ps(bp + k * NR + 8) : b0;
        STEP(0, a0) STEP(1, a1) STEP(2, a2) STEP(3, a3) STEP(4, a4) STEP(5, a5)
    }
#undef STEP
    const __m256 bb0 = _mm256_loadu_ps(bias), bb1 = _mm256_loadu_ps(bias + 8);
    const int64_t n0 = ncols < 8 ? ncols : 8, n1 = ncols - 8;
#define OUT(i)                                                                          \
    if (mr > i) {                                                                       \
        put(y + i * M, finish(c##i##0, z + i * M, bb0, has_z, clip, lo, hi, n0), n0);  \
        if (nv > 1)                                                                     \
            put(y + i * M + 8, finish(c##i##1, z + i * M + 8, bb1, has_z, clip, lo, hi, \
                                      n1), n1);                                         \
    }
    OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5)
#undef OUT
}

/* a tile of mr (1..4) rows x 24 columns: the full panel bp (16 columns) and the first
 * vector of the next, last panel bq (ncols <= 8 valid columns): three vectors per row, so a
 * last panel of <= 8 columns costs no 6 x 8 tiles (one panel load per six FMAs) */
static inline __attribute__((always_inline)) void tile24(
        const int mr, const float *a, int64_t K, const float *bp, const float *bq,
        const float *bias, const float *z, float *y, int64_t M, int64_t ncols,
        int has_z, int clip, __m256 lo, __m256 hi) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00,
           c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    const float *a0 = a, *a1 = a + K, *a2 = a + 2 * K, *a3 = a + 3 * K;
#define STEP(i, ai)                                                        \
    if (mr > i) {                                                          \
        __m256 av = _mm256_broadcast_ss(ai + k);                           \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                        \
        c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);                        \
        c##i##2 = _mm256_fmadd_ps(av, b2, c##i##2);                        \
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + k * NR);
        __m256 b1 = _mm256_loadu_ps(bp + k * NR + 8);
        __m256 b2 = _mm256_loadu_ps(bq + k * NR);
        STEP(0, a0) STEP(1, a1) STEP(2, a2) STEP(3, a3)
    }
#undef STEP
    const __m256 bb0 = _mm256_loadu_ps(bias), bb1 = _mm256_loadu_ps(bias + 8),
                 bb2 = _mm256_loadu_ps(bias + 16);
#define OUT(i)                                                                           \
    if (mr > i) {                                                                        \
        put(y + i * M, finish(c##i##0, z + i * M, bb0, has_z, clip, lo, hi, 8), 8);      \
        put(y + i * M + 8, finish(c##i##1, z + i * M + 8, bb1, has_z, clip, lo, hi, 8), 8); \
        put(y + i * M + 16, finish(c##i##2, z + i * M + 16, bb2, has_z, clip, lo, hi,    \
                                   ncols), ncols);                                      \
    }
    OUT(0) OUT(1) OUT(2) OUT(3)
#undef OUT
}

/* rows r .. re-1 of the last full panel and the last (<= 8 columns) one, 4-row tiles */
static void pair_rows(const float *A, int64_t K, const float *bp, const float *bias,
                      const float *Z, float *Y, int64_t M, int64_t col, int64_t ncols,
                      int64_t r, int64_t re, int has_z, int clip, __m256 lo, __m256 hi) {
#define T(mr) tile24(mr, A + r * K, K, bp, bp + K * NR, bias, \
                     Z + (has_z ? r * M + col : 0), Y + r * M + col, M, ncols, has_z, clip, \
                     lo, hi)
    for (; r + 4 <= re; r += 4)
        T(4);
    switch (re - r) {
    case 3: T(3); break;
    case 2: T(2); break;
    case 1: T(1); break;
    default: break;
    }
#undef T
}

/* rows r0 .. r0 + n - 1 (n < 6 or a whole number of 6-row tiles) of one panel */
static inline __attribute__((always_inline)) void panel_rows(
        const int nv, const float *A, int64_t K, const float *bp, const float *bias,
        const float *Z, float *Y, int64_t M, int64_t col, int64_t ncols, int64_t r,
        int64_t re, int has_z, int clip, __m256 lo, __m256 hi) {
#define T(mr) tile(mr, nv, A + r * K, K, bp, bias, Z + (has_z ? r * M + col : 0), \
                   Y + r * M + col, M, ncols, has_z, clip, lo, hi)
    for (; r + MR <= re; r += MR)
        T(6);
    switch (re - r) {
    case 5: T(5); break;
    case 4: T(4); break;
    case 3: T(3); break;
    case 2: T(2); break;
    case 1: T(1); break;
    default: break;
    }
#undef T
}

/* gemm on rows r0 .. r1-1 and the panels q0 .. q1-1 (a range that holds the last full
 * panel of a paired tail holds the tail too: see gemm_panels_block) */
static void gemm_range(const float *A, const float *Bp, const float *bias, const float *Z,
                       float *Y, int64_t K, int64_t M, int64_t r0, int64_t r1, int64_t has_z,
                       float lo, float hi, int64_t q0, int64_t q1) {
    if (r1 <= r0 || M <= 0 || q1 <= q0)
        return;
    const int clip = !(isinf(lo) && lo < 0 && isinf(hi) && hi > 0);
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const int hz = has_z != 0;
    const int64_t panels = (M + NR - 1) / NR;
    /* rows per block. Packed weights that fit in L2 (<= MC_SMALL_B floats, 96 KiB): one tile
     * of rows at a time, every panel over it while its A part is in L1 (A is read once).
     * Larger weights: blocks whose A part (MC_A floats, 128 KiB) stays in L2 while each
     * panel, read once per block, passes over it (measured on AMD EPYC, AVX2). */
    int64_t mc;
    if (K * panels * NR <= MC_SMALL_B) {
        mc = MR;
    } else {
        mc = (MC_A / (K > 0 ? K : 1)) / MR * MR;
        if (mc < MR)
            mc = MR;
        if (mc > 1024)
            mc = 1024;
    }
    for (int64_t rb = r0; rb < r1; rb += mc) {
        const int64_t re = rb + mc < r1 ? rb + mc : r1;
        /* a last panel of <= 8 columns goes with the full one before it (4 x 24 tiles) */
        const int64_t tail = M % NR, paired = panels >= 2 && tail > 0 && tail <= 8;
        for (int64_t p = q0; p < q1; p++) {
            const int64_t col = p * NR, ncols = M - col < NR ? M - col : NR;
            const float *bp = Bp + p * K * NR;
            if (paired && p == panels - 2) {
                pair_rows(A, K, bp, bias + col, Z, Y, M, col, tail, rb, re, hz, clip, vlo,
                          vhi);
                break;
            }
            if (ncols > 8)
                panel_rows(2, A, K, bp, bias + col, Z, Y, M, col, ncols, rb, re, hz, clip,
                           vlo, vhi);
            else
                panel_rows(1, A, K, bp, bias + col, Z, Y, M, col, ncols, rb, re, hz, clip,
                           vlo, vhi);
        }
    }
}

/* Y rows r0 .. r1-1; Bp the packed weights (ceil(M/16) panels of K x 16), bias padded to a
 * multiple of 16 (zeros when the convolution has none), Z read only when has_z. */
void wb_gemm_avx2_gemm(const float *A, const float *Bp, const float *bias, const float *Z,
                       float *Y, int64_t K, int64_t M, int64_t r0, int64_t r1, int64_t has_z,
                       float lo, float hi) {
    gemm_range(A, Bp, bias, Z, Y, K, M, r0, r1, has_z, lo, hi, 0, (M + NR - 1) / NR);
}

/* gemm_block's 12 slots, then the panels q0 .. q1-1 (16 output columns each) to compute:
 * a 1x1 layer with few rows (7x7 maps at batch 1) split over its output channels, each
 * thread reading only its part of the packed weights. When the last panel has <= 8
 * columns it is computed together with the full panel before it: a range must then hold
 * both or neither (the caller's cuts), and every value has gemm's bits whatever the ranges. */
void wb_gemm_avx2_gemm_panels_block(const int64_t *a) {
    double lo, hi;
    memcpy(&lo, a + 10, sizeof lo);
    memcpy(&hi, a + 11, sizeof hi);
    gemm_range((const float *)a[0], (const float *)a[1], (const float *)a[2],
               (const float *)a[3], (float *)a[4], a[5], a[6], a[7], a[8], a[9], (float)lo,
               (float)hi, a[12], a[13]);
}

/* gemm with its arguments in one int64 block: A, Bp, bias, Z, Y (addresses), K, M, r0, r1,
 * has_z, then lo and hi as float64 bit patterns. One ctypes argument instead of twelve
 * (~0.4 us each): what a node's pre-bound call uses (workbench/ops/conv_nhwc.py). */
void wb_gemm_avx2_gemm_block(const int64_t *a) {
    double lo, hi;
    memcpy(&lo, a + 10, sizeof lo);
    memcpy(&hi, a + 11, sizeof hi);
    wb_gemm_avx2_gemm((const float *)a[0], (const float *)a[1], (const float *)a[2],
                      (const float *)a[3], (float *)a[4], a[5], a[6], a[7], a[8], a[9],
                      (float)lo, (float)hi);
}

/* A transformer node's whole step in one call: gemm_block's product (slots 0..11), then,
 * when slot 12 / 20 holds a function address, the engine's compiled GELU and LayerNorm kernels
 * (workbench/compiled/kernels/transformer.py, the entry points of their loaded machine code)
 * called from here with the arguments the engine would pass them through ctypes:
 *   12 gelu, 13..17 its x, y, b, z, P addresses, 18, 19 its row range;
 *   20 layer_norm, 21..28 its x, skip, bias, gamma, beta, y, sum, P addresses, 29, 30 its row
 *   range, 31 eps as a float64 bit pattern (rounded to float32, as ctypes rounds it).
 * The same kernels on the same arrays in the same order as the separate calls, so the same
 * bits; one ctypes argument instead of ~30 (workbench/ops/linalg.py, the pre-bound
 * FusedMatMul/MatMul/Gemm step). */
typedef void (*wb_gelu_fn)(const float *, float *, const float *, const float *,
                           const int64_t *, int64_t, int64_t);
typedef void (*wb_layer_norm_fn)(const float *, const float *, const float *, const float *,
                                 const float *, float *, float *, const int64_t *, int64_t,
                                 int64_t, float);

void wb_gemm_avx2_fused_block(const int64_t *a) {
    wb_gemm_avx2_gemm_block(a);
    if (a[12]) {
        wb_gelu_fn g = (wb_gelu_fn)(intptr_t)a[12];
        g((const float *)a[13], (float *)a[14], (const float *)a[15], (const float *)a[16],
          (const int64_t *)a[17], a[18], a[19]);
    }
    if (a[20]) {
        double eps;
        memcpy(&eps, a + 31, sizeof eps);
        wb_layer_norm_fn f = (wb_layer_norm_fn)(intptr_t)a[20];
        f((const float *)a[21], (const float *)a[22], (const float *)a[23],
          (const float *)a[24], (const float *)a[25], (float *)a[26], (float *)a[27],
          (const int64_t *)a[28], a[29], a[30], (float)eps);
    }
}

/* fused_block behind the checks a pre-bound step makes on every call, done here instead of in
 * Python: slots 0..31 as fused_block's, then
 *   32 ns, 33 idx (int64[ns]), 34 W (the weights' first element), 35 sample (uint32[ns]):
 *      the weights' elements W[idx[i]] must still hold the bits sample[i] (the packing's check
 *      for an in-place edit);
 *   36 nb, 37 bias, 38 snapshot: the bias's nb bytes must still be the snapshot's;
 *   39 off: the offset of the data pointer in a numpy array object;
 *   40 A, 41 Z (0: none), 42 Y: the array objects' addresses (Python's id); their data
 *      pointers go to slot 0, slot a[43] (Z) and slots a[44] and a[45] (Y; -1: none).
 * Returns 1, with nothing computed or written, when a check fails; else runs fused_block and
 * returns 0. */
static inline int64_t check_and_bind(int64_t *a) {
    const uint32_t *w = (const uint32_t *)(intptr_t)a[34];
    const int64_t *idx = (const int64_t *)(intptr_t)a[33];
    const uint32_t *smp = (const uint32_t *)(intptr_t)a[35];
    for (int64_t i = 0; i < a[32]; i++)
        if (w[idx[i]] != smp[i]) return 1;
    if (a[36] && memcmp((const void *)(intptr_t)a[37], (const void *)(intptr_t)a[38],
                        (size_t)a[36]))
        return 1;
    const int64_t off = a[39];
#define WB_DATA(obj) (*(const int64_t *)((const char *)(intptr_t)(obj) + off))
    a[0] = WB_DATA(a[40]);
    if (a[41]) a[a[43]] = WB_DATA(a[41]);
    const int64_t y = WB_DATA(a[42]);
    a[a[44]] = y;
    if (a[45] >= 0) a[a[45]] = y;
#undef WB_DATA
    return 0;
}

int64_t wb_gemm_avx2_checked_block(int64_t *a) {
    if (check_and_bind(a)) return 1;
    wb_gemm_avx2_fused_block(a);
    return 0;
}

/* checked_block's checks and addresses, then the step in row pieces run by the caller and
 * worker threads: slot 46 the address of a C function running a set of pieces (the engine's
 * thread pool entry, workbench.ops.parallel.Pieces), 47 the address of its argument (the
 * pieces' descriptor, whatever that function reads), 48 the address of the piece table
 * t: t[0] the number n of pieces, t[1 + i] piece i's block of 32 slots (the blocks the
 * descriptor names), t[1 + n .. 1 + 2n] the n + 1 row cuts. Each piece's block gets slots
 * 0..31 of this one with its rows as the row range of the product, the GELU and the
 * LayerNorm (each kernel computes a row from that row's data alone, in the same order
 * whatever the range: the same bits as one call). Returns 1, nothing computed, when a check
 * fails. */
int64_t wb_gemm_avx2_checked_pieces(int64_t *a) {
    if (check_and_bind(a)) return 1;
    const int64_t *t = (const int64_t *)(intptr_t)a[48];
    const int64_t n = t[0], *cuts = t + 1 + n;
    for (int64_t p = 0; p < n; p++) {
        int64_t *b = (int64_t *)(intptr_t)t[1 + p];
        memcpy(b, a, 32 * sizeof(int64_t));
        b[7] = b[18] = b[29] = cuts[p];
        b[8] = b[19] = b[30] = cuts[p + 1];
    }
    ((void (*)(const int64_t *))(intptr_t)a[46])((const int64_t *)(intptr_t)a[47]);
    return 0;
}

/* A pre-bound call's array addresses from the array objects, then the call: a[0] a kernel
 * taking one int64 block, a[1] that block, a[2] the offset of the data pointer in a numpy
 * array object, a[3] n; slot i < n of the block gets the data pointer of the object at
 * address a[4 + i] (Python's id), or 0 where that is 0. */
void wb_gemm_avx2_objects_call(const int64_t *a) {
    int64_t *blk = (int64_t *)(intptr_t)a[1];
    for (int64_t i = 0; i < a[3]; i++)
        blk[i] = a[4 + i] ? *(const int64_t *)((const char *)(intptr_t)a[4 + i] + a[2]) : 0;
    ((void (*)(int64_t *))(intptr_t)a[0])(blk);
}

/* ------------------------------------------------------------------------------------------
 * Indirect convolution (group 1, any kernel size, stride, padding, dilation), channels-last:
 *
 *   Y[r, m] = clip(sum_t sum_c in(r, t)[c] * B[t*C + c, m] + bias[m] + Z[r, m], lo, hi)
 *
 * for output pixels r0 <= r < r1 of (N*OH*OW) rows. in(r, t) is the C contiguous channels of
 * the input pixel that tap t of output pixel r reads: X + n*img + ind[q*T + t] for the image
 * n = r / P and the pixel q = r % P of it (P = OH*OW, img = H*W*C), or the zero row where
 * ind is negative (padding). The indirection table ind (P x T offsets) depends only on the
 * shapes, so it is built once per plan; B is the (T*C, M) weights ("HWIO" rows: tap-major,
 * channels inside) packed as for wb_gemm_avx2_gemm. A register tile of 6 pixels x 16 output
 * channels runs over a block of taps (K blocking: a block's slice of a panel stays in L1/L2
 * while the tiles of a row block pass over it); blocks after the first add to what the
 * previous one stored in Y, and the epilogue runs with the last block.
 *
 * The first tile of each (row block, panel, tap block) also prefetches, line by line as it
 * reads its own slice, the slice that comes next (the next panel's, or after the last panel
 * the next tap block's first) into L2: ResNet's 3x3 weights (0.6-9.4 MB per layer) are read
 * from memory every run and only a few tiles reuse each slice at batch 1 (49 pixels on 7x7
 * maps), so the next slice's lines are on their way while this one is computed. A prefetch
 * changes no arithmetic: the same FMAs in the same order, the same bits.
 */
#ifndef KC_CONV
#define KC_CONV 12288   /* floats of a panel's slice per K block (48 KiB) */
#endif

static inline __attribute__((always_inline)) __m256 ld(const float *p, int64_t n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n));
}

/* one tile: mr (1..6) pixels from r (image n0, pixel q0 of it), nv (1 or 2) vectors of the
 * panel slice bp (taps t0 .. t1-1), ncols valid columns */
static inline __attribute__((always_inline)) void itile(
        const int mr, const int nv, const float *X, const int64_t *ind, const float *zero,
        int64_t n0, int64_t q0, int64_t P, int64_t img, int64_t T, int64_t C, int64_t t0,
        int64_t t1, const float *bp, const float *bias, const float *z, float *y, int64_t M,
        int64_t ncols, int first, int last, int has_z, int clip, __m256 lo, __m256 hi,
        const float *pf) {
    const float *xb[MR];
    const int64_t *ir[MR];
    for (int i = 0; i < MR; i++) {
        if (i < mr) {
            int64_t q = q0 + i, n = n0;
            while (q >= P) {   /* the tile runs into the next image(s) */
                q -= P;
                n++;
            }
            xb[i] = X + n * img;
            ir[i] = ind + q * T;
        } else {
            xb[i] = zero;
            ir[i] = ind;
        }
    }
    const int64_t n0c = ncols < 8 ? ncols : 8, n1c = ncols - 8;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
           c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    if (!first) {
#define LD(i)                                            \
    if (mr > i) {                                        \
        c##i##0 = ld(y + i * M, n0c);                    \
        if (nv > 1) c##i##1 = ld(y + i * M + 8, n1c);    \
    }
        LD(0) LD(1) LD(2) LD(3) LD(4) LD(5)
#undef LD
    }
#define PTR(i)                                                          \
    const float *a##i = zero;                                           \
    if (mr > i) {                                                       \
        const int64_t o = ir[i][t];                                     \
        a##i = o >= 0 ? xb[i] + o : zero;                               \
    }
#define STEP(i)                                                         \
    if (mr > i) {                                                       \
        __m256 av = _mm256_broadcast_ss(a##i + c);                      \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                     \
        if (nv > 1) c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);         \
    }
    for (int64_t t = t0; t < t1; t++) {
        PTR(0) PTR(1) PTR(2) PTR(3) PTR(4) PTR(5)
        const float *bt = bp + (t - t0) * C * NR;
        if (pf) {   /* this tile prefetches the next slice (pf), one line per channel */
            const char *pt = (const char *)(pf + (t - t0) * C * NR);
#pragma GCC unroll 2
            for (int64_t c = 0; c < C; c++) {
                _mm_prefetch(pt + c * NR * (int64_t)sizeof(float), _MM_HINT_T1);
                __m256 b0 = _mm256_loadu_ps(bt + c * NR);
                __m256 b1 = nv > 1 ? _mm256_loadu_ps(bt + c * NR + 8) : b0;
                STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)
            }
            continue;
        }
#pragma GCC unroll 2
        for (int64_t c = 0; c < C; c++) {
            __m256 b0 = _mm256_loadu_ps(bt + c * NR);
            __m256 b1 = nv > 1 ? _mm256_loadu_ps(bt + c * NR + 8) : b0;
            STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)
        }
    }
#undef STEP
#undef PTR
    if (last) {
        const __m256 bb0 = _mm256_loadu_ps(bias), bb1 = _mm256_loadu_ps(bias + 8);
#define OUT(i)                                                                           \
    if (mr > i) {                                                                        \
        put(y + i * M, finish(c##i##0, z + i * M, bb0, has_z, clip, lo, hi, n0c), n0c); \
        if (nv > 1)                                                                      \
            put(y + i * M + 8, finish(c##i##1, z + i * M + 8, bb1, has_z, clip, lo, hi,  \
                                      n1c), n1c);                                        \
    }
        OUT(0) OUT(1) OUT(2) OUT(3) OUT(4) OUT(5)
#undef OUT
    } else {
#define ST(i)                                            \
    if (mr > i) {                                        \
        put(y + i * M, c##i##0, n0c);                    \
        if (nv > 1) put(y + i * M + 8, c##i##1, n1c);    \
    }
        ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
#undef ST
    }
}

/* pixels r .. re-1 of one panel (columns col .. col+ncols-1), taps t0 .. t1-1; the first
 * tile prefetches the slice at pf (NULL: none) */
static inline __attribute__((always_inline)) void iconv_rows(
        const int nv, const float *X, const int64_t *ind, const float *zero, int64_t P,
        int64_t img, int64_t T, int64_t C, int64_t t0, int64_t t1, const float *bp,
        const float *bias, const float *Z, float *Y, int64_t M, int64_t col, int64_t ncols,
        int64_t r, int64_t re, int first, int last, int has_z, int clip, __m256 lo,
        __m256 hi, const float *pf) {
    int64_t n = r / P, q = r - n * P;
#define T_(mr) itile(mr, nv, X, ind, zero, n, q, P, img, T, C, t0, t1, bp, bias,          \
                     Z + (has_z ? r * M + col : 0), Y + r * M + col, M, ncols, first, last, \
                     has_z, clip, lo, hi, pf)
    for (; r + MR <= re; r += MR) {
        T_(6);
        pf = NULL;
        q += MR;
        while (q >= P) {
            q -= P;
            n++;
        }
    }
    switch (re - r) {
    case 5: T_(5); break;
    case 4: T_(4); break;
    case 3: T_(3); break;
    case 2: T_(2); break;
    case 1: T_(1); break;
    default: break;
    }
#undef T_
}

/* iconv on rows r0 .. r1-1 and the 16-column panels q0 .. q1-1 (every output value is
 * computed by the same instructions whatever the ranges: a panel is never paired) */
static void iconv_range(const float *X, const int64_t *ind, const float *zero,
                        const float *Bp, const float *bias, const float *Z, float *Y,
                        int64_t C, int64_t T, int64_t M, int64_t P, int64_t img, int64_t r0,
                        int64_t r1, int64_t has_z, float lo, float hi, int64_t q0,
                        int64_t q1) {
    if (r1 <= r0 || M <= 0 || P <= 0 || T <= 0 || C <= 0 || q1 <= q0)
        return;
    const int clip = !(isinf(lo) && lo < 0 && isinf(hi) && hi > 0);
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const int hz = has_z != 0;
    const int64_t K = T * C;
    /* taps per K block: the block's slice of a panel (tb*C*16 floats) stays in cache */
    int64_t tb = KC_CONV / (C * NR);
    if (tb < 1)
        tb = 1;
    if (tb > T)
        tb = T;
    /* pixels per row block: what their taps of one K block read (at most mc*tb*C floats)
     * stays in L2 while every panel passes over it */
    int64_t mc = (MC_A / (tb * C)) / MR * MR;
    if (mc < 4 * MR)
        mc = 4 * MR;
    if (mc > 1024)
        mc = 1024;
    for (int64_t rb = r0; rb < r1; rb += mc) {
        const int64_t re = rb + mc < r1 ? rb + mc : r1;
        for (int64_t t0 = 0; t0 < T; t0 += tb) {
            const int64_t t1 = t0 + tb < T ? t0 + tb : T;
            const int first = t0 == 0, last = t1 == T;
            for (int64_t p = q0; p < q1; p++) {
                const int64_t col = p * NR, ncols = M - col < NR ? M - col : NR;
                const float *bp = Bp + p * K * NR + t0 * C * NR;
                /* the slice after this one: the next panel's (same taps), else the next tap
                 * block's first panel; the last one of a row block prefetches nothing. (A
                 * shorter last tap block is prefetched as long as this one: the lines past
                 * it are the next panel's, or past the array's end for one panel, which a
                 * prefetch may name: it never faults.) */
                const float *pf = p + 1 < q1 ? bp + K * NR
                                  : t1 < T ? Bp + q0 * K * NR + t1 * C * NR : NULL;
                if (ncols > 8)
                    iconv_rows(2, X, ind, zero, P, img, T, C, t0, t1, bp, bias + col, Z, Y,
                               M, col, ncols, rb, re, first, last, hz, clip, vlo, vhi, pf);
                else
                    iconv_rows(1, X, ind, zero, P, img, T, C, t0, t1, bp, bias + col, Z, Y,
                               M, col, ncols, rb, re, first, last, hz, clip, vlo, vhi, pf);
            }
        }
    }
}

/* Y rows (output pixels) r0 .. r1-1. X the (N, H, W, C) input, ind the (P, T) offsets
 * (negative: padding), zero a row of >= C zeros, Bp the packed (T*C, M) weights, bias padded
 * to a multiple of 16, Z read only when has_z. */
void wb_gemm_avx2_iconv(const float *X, const int64_t *ind, const float *zero,
                        const float *Bp, const float *bias, const float *Z, float *Y,
                        int64_t C, int64_t T, int64_t M, int64_t P, int64_t img, int64_t r0,
                        int64_t r1, int64_t has_z, float lo, float hi) {
    iconv_range(X, ind, zero, Bp, bias, Z, Y, C, T, M, P, img, r0, r1, has_z, lo, hi, 0,
                (M + NR - 1) / NR);
}

/* iconv with its arguments in one int64 block (a pool's unit of work, see blas_worker.par):
 * X, ind, zero, Bp, bias, Z, Y (addresses), C, T, M, P, img, r0, r1, has_z, lo and hi as
 * float64 bit patterns, then the panels q0 .. q1-1 (16 output channels each) it computes:
 * a layer with few output pixels (ResNet's 7x7 and 14x14 maps at batch 1) is split over
 * its output channels, so each thread reads its part of the packed weights only. */
void wb_gemm_avx2_iconv_block(const int64_t *a) {
    double lo, hi;
    memcpy(&lo, a + 15, sizeof lo);
    memcpy(&hi, a + 16, sizeof hi);
    iconv_range((const float *)a[0], (const int64_t *)a[1], (const float *)a[2],
                (const float *)a[3], (const float *)a[4], (const float *)a[5], (float *)a[6],
                a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], (float)lo, (float)hi,
                a[17], a[18]);
}
