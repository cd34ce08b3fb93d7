/* The weight gradient of a group-1 convolution on channels-last float32 arrays, AVX2 + FMA
 * (see wgrad_avx2.py):
 *
 *   dW[t, m, c] = sum over pixels p < rows of dY[p, m] * X[image(p), pixel(p, t), c]
 *
 * for taps t0 <= t < t1 and output channels m0 <= m < m1, every c < C. X is (N, H, W, C), dY is
 * (rows = N * OHW, M), dW is (taps, M, C) (OIHW is then one cheap transpose away: per m, a (taps,
 * C) -> (C, taps) copy); ind is the (OHW, taps) table of element offsets of each output pixel's
 * tap into one image (-1: padding, read from the zero row of C zeros, so that 0 * Inf = NaN as
 * in the im2col product). No im2col: the rows of X are read through the table.
 *
 * Pixels in blocks of bp: the block's dY (rows m0..m1) is packed as 6-row tiles and, per tap,
 * its X rows as 16-channel panels, so that the register tile (6 output channels x 16 input
 * channels, 12 accumulators; per pixel 6 broadcasts of dY and two loads of X) reads both
 * contiguously — read in place, rows C or M floats apart thrash the L1 sets. Every dW element
 * is one float32 sum over the pixels in increasing order (the tile is loaded from dW at each
 * block and stored back), so the bits depend neither on how callers split (t, m) ranges over
 * threads nor on the thread count. Channel tails use masked loads and stores, output-channel
 * tails a tile of fewer rows.
 */
#include <immintrin.h>
#include <stdint.h>

static const int32_t mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i lanes(int64_t n) {   /* the first n (0..8) lanes on */
    if (n > 8) n = 8;
    if (n < 0) n = 0;
    return _mm256_loadu_si256((const __m256i *)(mask_table + 8 - n));
}

#define BPMAX 512

/* R rows (output channels m) of the tile, literal 1..6 in each inlined copy: yk the block's
 * packed dY for these rows (np_ pixels x 6), xk one packed 16-channel panel of the block's X
 * for this tap (np_ x 16); d the tile's first element in dW (rows C floats apart) */
static inline __attribute__((always_inline)) void tile(
        const int R, const float *yk, const float *xk, float *d, int64_t C, int64_t np_,
        int64_t nc) {
    __m256i k0 = lanes(nc), k1 = lanes(nc - 8);
    __m256 a0[6], a1[6];
    /* masked loads/stores only in a channel tail: on AMD Zen a masked store is microcoded */
    if (nc == 16) {
        for (int r = 0; r < R; r++) {
            a0[r] = _mm256_loadu_ps(d + r * C);
            a1[r] = _mm256_loadu_ps(d + r * C + 8);
        }
    } else {
        for (int r = 0; r < R; r++) {
            a0[r] = _mm256_maskload_ps(d + r * C, k0);
            a1[r] = _mm256_maskload_ps(d + r * C + 8, k1);
        }
    }
    for (int64_t i = 0; i < np_; i++, yk += 6, xk += 16) {
        __m256 x0 = _mm256_loadu_ps(xk), x1 = _mm256_loadu_ps(xk + 8);
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_broadcast_ss(yk + r);
            a0[r] = _mm256_fmadd_ps(b, x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(b, x1, a1[r]);
        }
    }
    if (nc == 16) {
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(d + r * C, a0[r]);
            _mm256_storeu_ps(d + r * C + 8, a1[r]);
        }
    } else {
        for (int r = 0; r < R; r++) {
            _mm256_maskstore_ps(d + r * C, k0, a0[r]);
            _mm256_maskstore_ps(d + r * C + 8, k1, a1[r]);
        }
    }
}

/* dW as (taps, M, C): rows t0 <= t < t1, m0 <= m < m1. yk (ceil((m1 - m0)/6) * 6 * bp floats)
 * and xk (ceil(C/16) * 16 * bp floats) are the caller's work buffers (one pair per thread),
 * bp <= BPMAX the pixels of a block */
void wb_wgrad_avx2_wgrad(const float *x, const int64_t *ind, const float *zero,
                         const float *dy, float *dw, float *yk, float *xk, int64_t C,
                         int64_t taps, int64_t M, int64_t OHW, int64_t HWC, int64_t rows,
                         int64_t bp, int64_t t0, int64_t t1, int64_t m0, int64_t m1) {
    for (int64_t t = t0; t < t1; t++)
        for (int64_t m = m0; m < m1; m++)
            for (int64_t c = 0; c < C; c++)
                dw[(t * M + m) * C + c] = 0.0f;
    if (rows <= 0 || m1 <= m0 || C <= 0 || bp < 1) return;
    if (bp > BPMAX) bp = BPMAX;
    int64_t mt = (m1 - m0 + 5) / 6, cp = (C + 15) / 16;
    for (int64_t p0 = 0; p0 < rows; p0 += bp) {
        int64_t np_ = rows - p0 < bp ? rows - p0 : bp;
        /* dY's block, rows m0..m1, as 6-row tiles (np_ x 6 each), zeros past m1 */
        for (int64_t j = 0; j < mt; j++) {
            int64_t m = m0 + j * 6, nm = m1 - m < 6 ? m1 - m : 6;
            float *dst = yk + j * bp * 6;
            const float *src = dy + p0 * M + m;
            for (int64_t i = 0; i < np_; i++, dst += 6, src += M) {
                int64_t r = 0;
                for (; r < nm; r++) dst[r] = src[r];
                for (; r < 6; r++) dst[r] = 0.0f;
            }
        }
        for (int64_t t = t0; t < t1; t++) {
            /* the block's X rows for tap t, as 16-channel panels (np_ x 16), zeros past C */
            for (int64_t i = 0; i < np_; i++) {
                int64_t p = p0 + i, n = p / OHW, q = p - n * OHW;
                int64_t off = ind[q * taps + t];
                const float *src = off < 0 ? zero : x + n * HWC + off;
                for (int64_t j = 0; j < cp; j++) {
                    float *dst = xk + (j * bp + i) * 16;
                    int64_t c = j * 16, nc = C - c < 16 ? C - c : 16;
                    if (nc == 16) {
                        _mm256_storeu_ps(dst, _mm256_loadu_ps(src + c));
                        _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(src + c + 8));
                    } else {
                        int64_t r = 0;
                        for (; r < nc; r++) dst[r] = src[c + r];
                        for (; r < 16; r++) dst[r] = 0.0f;
                    }
                }
            }
            for (int64_t j = 0; j < mt; j++) {
                int64_t m = m0 + j * 6, rm = m1 - m < 6 ? m1 - m : 6;
                const float *y = yk + j * bp * 6;
                for (int64_t k = 0; k < cp; k++) {
                    int64_t c = k * 16, nc = C - c < 16 ? C - c : 16;
                    const float *xp = xk + k * bp * 16;
                    float *d = dw + (t * M + m) * C + c;
                    switch (rm) {
                    case 6: tile(6, y, xp, d, C, np_, nc); break;
                    case 5: tile(5, y, xp, d, C, np_, nc); break;
                    case 4: tile(4, y, xp, d, C, np_, nc); break;
                    case 3: tile(3, y, xp, d, C, np_, nc); break;
                    case 2: tile(2, y, xp, d, C, np_, nc); break;
                    default: tile(1, y, xp, d, C, np_, nc); break;
                    }
                }
            }
        }
    }
}

/* The gradient of an embedding table (Gather along axis 0): target[index[k], :] += values[k, :]
 * for k = 0, 1, ..., n - 1 in that order, target (rows, m) and values (n, m) float32: numpy's
 * np.add.at(target, index, values), the same float32 sums in the same order (no reassociation:
 * only the m columns of one row are added side by side). Every index is checked against
 * [0, rows) first: with one outside, nothing is written and bad[0] is 1 (the caller then takes
 * numpy's path, which raises), else bad[0] is 0. */
void wb_wgrad_avx2_scatter_rows(float *restrict target, const int64_t *restrict index,
                                const float *restrict values, int64_t *restrict bad, int64_t n,
                                int64_t m, int64_t rows) {
    for (int64_t k = 0; k < n; k++) {
        if (index[k] < 0 || index[k] >= rows) {
            bad[0] = 1;
            return;
        }
    }
    bad[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        float *restrict t = target + index[k] * m;
        const float *restrict v = values + k * m;
        for (int64_t j = 0; j < m; j++)
            t[j] += v[j];
    }
}
