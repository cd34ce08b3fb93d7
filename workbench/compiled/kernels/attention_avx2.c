/* Attention on float32, one (batch, head) pair at a time, AVX2 + FMA (see attention_avx2.py).
 *
 *   Y[b, h, i, :] = softmax_j(mask(scale(sum_d Q[b, h, i, d] * K[b, h, d, j]))) @ V[b, h, :, :]
 *
 * for the pairs p0 <= p < p1, p = b * H + h. Every array is read or written through element
 * strides (b, h, row, column), so the graph's head split (Reshape + Transpose of Q, K, V) and
 * head merge (Transpose (0, 2, 1, 3) + Reshape of Y) cost no copy; a stride of 0 broadcasts.
 *
 * Per pair, K is packed once into (D, SkP) (SkP = Sk rounded up to 8, zero columns past Sk)
 * unless its columns are already contiguous with Sk a multiple of 8, and V into (Sk, DvP)
 * unless its rows are contiguous with Dv a multiple of 8. Then, ROWS query rows at a time:
 * the scores of the rows (register tiles of 4 rows x 16 columns, one FMA chain per output
 * over d in order), scaled as they leave the registers (x * scale or x / scale), masked (an
 * additive float32 mask, or ``fill`` where a uint8 mask is non-zero / zero), the padding
 * columns set to -inf, the row's softmax in place, then the rows' product with V (tiles of 4
 * rows x 16 values, FMA chains over j in order) stored straight into Y.
 *
 * Softmax as the engine's compiled softmax (kernels/transformer.py): a row whose maximum is
 * -inf (every entry -inf) or +inf, or that holds a NaN, gives NaN; otherwise
 * exp(x - max) by range reduction to 2^k * p(r), |r| <= ln2/2, a degree-7 Taylor polynomial,
 * subnormal results kept (no flush to zero), the sum in 8 lanes, then each value times 1/sum.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* the call's arguments, one int64 block (see BLOCK in attention_avx2.py) */
typedef struct {
    const float *q, *k, *v;
    const void *m;
    float *y, *work;
    int64_t H, Sq, Sk, D, Dv;
    int64_t qb, qh, qi, qd, kb, kh, kd, kj, vb, vh, vj, ve, yb, yh, yi, ye, mb, mh, mi, mj;
    int64_t scale_mode, mask_mode, p0, p1, rows;
    double scale, fill;
} call_t;

/* slots of call_t (the attention's call block; ``attention_probs`` reads one more) */
#define ATT_SLOTS 38

static const int32_t mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i lanes(int64_t n) {   /* the first n (0..8) lanes on */
    return _mm256_loadu_si256((const __m256i *)(mask_table + 8 - n));
}

static inline float hmax(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* exp(x) for x <= 0 (x = -inf included, no NaN): the engine's compiled softmax's exp */
static inline __m256 exp_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-103.98f);
    const __m256 one = _mm256_set1_ps(1.0f);
    /* lanes below lo (masked scores: -inf, -3.4e38) give 0; they are computed as exp(0), not
     * exp(lo): an underflow to a subnormal costs a microcode assist per lane (measured: GPT-2's
     * causal mask made the kernel 1.5x slower) */
    const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_andnot_ps(below, x);
    __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.4426950408889634f),
                                               _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 5040), _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    __m256i ki = _mm256_cvtps_epi32(k);
    /* 2^k below float32's smallest normal (k < -126): 2^(k + 64) * 2^-64 */
    __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ki);
    __m256i kb = _mm256_add_epi32(ki, _mm256_and_si256(sub, _mm256_set1_epi32(64)));
    __m256 sc = _mm256_blendv_ps(one, _mm256_set1_ps(5.421010862427522e-20f),
                                 _mm256_castsi256_ps(sub));
    __m256 two_k = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(kb, _mm256_set1_epi32(127)), 23));
    __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, two_k), sc);
    return _mm256_andnot_ps(below, e);
}

/* the register tile both products share: a[r][x] = sum_{k < K} A[r * ai + k * ak] *
 * B[k * bs + 8x .. 8x + 7] for r < R, x < NV, accumulated over k in order; R and NV are
 * literals at every call, so the accumulators stay in registers */
static inline __attribute__((always_inline)) void fma_tile(
        const int R, const int NV, __m256 a[4][2], const float *A, int64_t ai, int64_t ak,
        const float *B, int64_t bs, int64_t K) {
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8")
        for (int x = 0; x < NV; x++)
            a[r][x] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 bv[2];
        _Pragma("GCC unroll 8")
        for (int x = 0; x < NV; x++)
            bv[x] = _mm256_loadu_ps(B + k * bs + 8 * x);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            __m256 av = _mm256_broadcast_ss(A + r * ai + k * ak);
            _Pragma("GCC unroll 8")
            for (int x = 0; x < NV; x++)
                a[r][x] = _mm256_fmadd_ps(av, bv[x], a[r][x]);
        }
    }
}

/* scores of R rows, NV vectors of columns from c: s[r, c..] = scaled(sum_d q[r * qi + d * qd] *
 * kp[d * ks + c..]); R and NV are literals at every call, so the accumulators stay in registers */
static inline __attribute__((always_inline)) void qk_tile(
        const int R, const int NV, const float *q, int64_t qi, int64_t qd, const float *kc,
        int64_t ks, int64_t D, float *s, int64_t ss, int64_t mode, __m256 scale) {
    __m256 a[4][2];
    fma_tile(R, NV, a, q, qi, qd, kc, ks, D);
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8")
        for (int x = 0; x < NV; x++) {
            __m256 t = a[r][x];
            if (mode == 1)
                t = _mm256_mul_ps(t, scale);
            else if (mode == 2)
                t = _mm256_div_ps(t, scale);
            _mm256_storeu_ps(s + r * ss + 8 * x, t);
        }
}

/* the scores of R rows, all SkP columns */
static inline __attribute__((always_inline)) void qk_rows(
        const int R, const float *q, int64_t qi, int64_t qd, const float *kp, int64_t ks,
        int64_t D, int64_t SkP, float *s, int64_t ss, int64_t mode, __m256 scale) {
    int64_t c = 0;
    for (; c + 16 <= SkP; c += 16)
        qk_tile(R, 2, q, qi, qd, kp + c, ks, D, s + c, ss, mode, scale);
    if (c < SkP)
        qk_tile(R, 1, q, qi, qd, kp + c, ks, D, s + c, ss, mode, scale);
}

/* one output vector: y[x * ye] = acc[x] for x < n (n <= 8) */
static inline void store_out(float *y, int64_t ye, int64_t n, __m256 acc) {
    if (ye == 1) {
        if (n >= 8)
            _mm256_storeu_ps(y, acc);
        else
            _mm256_maskstore_ps(y, lanes(n), acc);
    } else {
        float t[8];
        _mm256_storeu_ps(t, acc);
        for (int64_t x = 0; x < n && x < 8; x++)
            y[x * ye] = t[x];
    }
}

/* R rows of Y, NV vectors of values from e: y[r * yi + (e + x) * ye] = sum_{j < Sk}
 * p[r * ps + j * pj] * vp[j * vs + e + x], for e + x < Dv */
static inline __attribute__((always_inline)) void pv_tile(
        const int R, const int NV, const float *p, int64_t ps, int64_t pj, const float *ve,
        int64_t vs, int64_t Sk, int64_t nleft, float *y, int64_t yi, int64_t ye) {
    __m256 a[4][2];
    fma_tile(R, NV, a, p, ps, pj, ve, vs, Sk);
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8")
        for (int x = 0; x < NV; x++)
            if (nleft > 8 * x)
                store_out(y + r * yi + 8 * x * ye, ye, nleft - 8 * x, a[r][x]);
}

/* R rows of Y, all Dv values (p's values along a row pj apart) */
static inline __attribute__((always_inline)) void pv_rows(
        const int R, const float *p, int64_t ps, int64_t pj, const float *vp, int64_t vs,
        int64_t Sk, int64_t Dv, float *y, int64_t yi, int64_t ye) {
    int64_t e = 0;
    for (; e + 8 < Dv; e += 16)
        pv_tile(R, 2, p, ps, pj, vp + e, vs, Sk, Dv - e, y + e * ye, yi, ye);
    if (e < Dv)
        pv_tile(R, 1, p, ps, pj, vp + e, vs, Sk, Dv - e, y + e * ye, yi, ye);
}

/* 8 x 8 transpose in registers */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* K (Sk, D) rows at stride kj with contiguous d, packed transposed into kp (D, SkP), zero
 * columns past Sk: 8 x 8 blocks through registers */
static void pack_kt(const float *k, int64_t kj, int64_t Sk, int64_t D, float *kp, int64_t SkP) {
    for (int64_t j0 = 0; j0 < SkP; j0 += 8)
        for (int64_t d0 = 0; d0 < D; d0 += 8) {
            const int64_t nd = D - d0 < 8 ? D - d0 : 8;
            const __m256i m = lanes(nd);
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = j0 + i < Sk ? _mm256_maskload_ps(k + (j0 + i) * kj + d0, m)
                                   : _mm256_setzero_ps();
            transpose8(r);
            for (int64_t i = 0; i < nd; i++)
                _mm256_storeu_ps(kp + (d0 + i) * SkP + j0, r[i]);
        }
}

/* the mask of one row of scores s (Sk values) */
static void mask_row(const call_t *a, const void *mrow, float *s) {
    const int64_t Sk = a->Sk, mj = a->mj;
    if (a->mask_mode == 1) {
        const float *m = (const float *)mrow;
        if (mj == 1) {
            int64_t j = 0;
            for (; j + 8 <= Sk; j += 8)
                _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_loadu_ps(s + j),
                                                      _mm256_loadu_ps(m + j)));
            for (; j < Sk; j++)
                s[j] += m[j];
        } else if (mj == 0) {
            const float v = m[0];
            for (int64_t j = 0; j < Sk; j++)
                s[j] += v;
        } else {
            for (int64_t j = 0; j < Sk; j++)
                s[j] += m[j * mj];
        }
        return;
    }
    /* fill where the uint8 mask is non-zero (mode 2) or zero (mode 3) */
    const uint8_t *m = (const uint8_t *)mrow;
    const int want = a->mask_mode == 2;
    const float fill = (float)a->fill;
    if (mj == 0) {
        if ((m[0] != 0) == want)
            for (int64_t j = 0; j < Sk; j++)
                s[j] = fill;
        return;
    }
    int64_t j = 0;
    if (mj == 1) {
        const __m256 f = _mm256_set1_ps(fill);
        const __m256i zero = _mm256_setzero_si256();
        for (; j + 8 <= Sk; j += 8) {
            __m256i mb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(m + j)));
            __m256i is0 = _mm256_cmpeq_epi32(mb, zero);
            __m256 sel = _mm256_castsi256_ps(want ? _mm256_xor_si256(is0, _mm256_set1_epi32(-1))
                                                  : is0);
            _mm256_storeu_ps(s + j, _mm256_blendv_ps(_mm256_loadu_ps(s + j), f, sel));
        }
    }
    for (; j < Sk; j++)
        if ((m[j * mj] != 0) == want)
            s[j] = fill;
}

/* softmax of one row of SkP scores in place (columns Sk.. hold -inf) */
static void softmax_row(float *s, int64_t SkP) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    __m256 nan = _mm256_setzero_ps();
    for (int64_t j = 0; j < SkP; j += 8) {
        __m256 x = _mm256_loadu_ps(s + j);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, x);
    }
    const float m = hmax(mx);
    if (_mm256_movemask_ps(nan) || isinf(m)) {
        const __m256 q = _mm256_set1_ps(NAN);
        for (int64_t j = 0; j < SkP; j += 8)
            _mm256_storeu_ps(s + j, q);
        return;
    }
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < SkP; j += 8) {
        __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum(sum));
    for (int64_t j = 0; j < SkP; j += 8)
        _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
}

/* the forward of every entry; pout: where the probabilities go as well ((p1 - p0) pairs of
 * (Sq, Sk), contiguous, the pair p0 first), or NULL (inference: inlined away) */
static inline __attribute__((always_inline)) void attend(const call_t *a, float *pout) {
    const int64_t Sq = a->Sq, Sk = a->Sk, D = a->D, Dv = a->Dv, H = a->H;
    const int64_t SkP = (Sk + 7) & ~(int64_t)7, DvP = (Dv + 7) & ~(int64_t)7;
    const int64_t ROWS = a->rows;
    const int k_direct = a->kj == 1 && Sk % 8 == 0;
    const int v_direct = a->ve == 1 && Dv % 8 == 0;
    float *sc = a->work;                               /* (ROWS, SkP) scores */
    float *kp = sc + ROWS * SkP;                       /* (D, SkP) packed K */
    float *vp = kp + (k_direct ? 0 : D * SkP);         /* (Sk, DvP) packed V */
    const float sc32 = (float)a->scale;
    int64_t mode = a->scale_mode;
    uint32_t bits;
    memcpy(&bits, &sc32, 4);
    /* dividing by a positive power of two whose inverse is a normal float is multiplying by
     * that (exact) inverse: the same bits, without a division per score */
    const uint32_t ex = (bits >> 23) & 0xff;
    const float scv = mode == 2 && (bits & 0x807fffffu) == 0 && ex > 1 && ex < 253
                      ? (mode = 1, 1.0f / sc32) : sc32;
    const __m256 scale = _mm256_set1_ps(scv);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t p = a->p0; p < a->p1; p++) {
        const int64_t b = p / H, h = p % H;
        const float *q = a->q + b * a->qb + h * a->qh;
        const float *k = a->k + b * a->kb + h * a->kh;
        const float *v = a->v + b * a->vb + h * a->vh;
        float *y = a->y + b * a->yb + h * a->yh;
        const float *kk = k;
        int64_t ks = a->kd;
        if (!k_direct) {
            const int64_t kd = a->kd, kj = a->kj;
            if (kd == 1) {
                pack_kt(k, kj, Sk, D, kp, SkP);
            } else {
                for (int64_t d = 0; d < D; d++) {
                    for (int64_t j = 0; j < Sk; j++)
                        kp[d * SkP + j] = k[d * kd + j * kj];
                    for (int64_t j = Sk; j < SkP; j++)
                        kp[d * SkP + j] = 0.0f;
                }
            }
            kk = kp;
            ks = SkP;
        }
        const float *vv = v;
        int64_t vs = a->vj;
        if (!v_direct) {
            const int64_t vj = a->vj, ve = a->ve;
            for (int64_t j = 0; j < Sk; j++) {
                float *dst = vp + j * DvP;
                if (ve == 1)
                    memcpy(dst, v + j * vj, (size_t)Dv * sizeof(float));
                else
                    for (int64_t e = 0; e < Dv; e++)
                        dst[e] = v[j * vj + e * ve];
                for (int64_t e = Dv; e < DvP; e++)
                    dst[e] = 0.0f;
            }
            vv = vp;
            vs = DvP;
        }
        const char *mbase = a->mask_mode ? (const char *)a->m : 0;
        const int64_t msz = a->mask_mode == 1 ? 4 : 1;
        for (int64_t i0 = 0; i0 < Sq; i0 += ROWS) {
            const int64_t rc = Sq - i0 < ROWS ? Sq - i0 : ROWS;
            const float *qr = q + i0 * a->qi;
            int64_t i = 0;
            for (; i + 4 <= rc; i += 4)
                qk_rows(4, qr + i * a->qi, a->qi, a->qd, kk, ks, D, SkP, sc + i * SkP, SkP,
                        mode, scale);
            for (; i < rc; i++)
                qk_rows(1, qr + i * a->qi, a->qi, a->qd, kk, ks, D, SkP, sc + i * SkP, SkP,
                        mode, scale);
            for (i = 0; i < rc; i++) {
                float *s = sc + i * SkP;
                if (mbase)
                    mask_row(a, mbase + msz * (b * a->mb + h * a->mh + (i0 + i) * a->mi), s);
                if (Sk < SkP)
                    _mm256_maskstore_ps(s + SkP - 8, _mm256_xor_si256(lanes(8 - (SkP - Sk)),
                                                                      _mm256_set1_epi32(-1)),
                                        ninf);
                softmax_row(s, SkP);
                if (pout)
                    memcpy(pout + ((p - a->p0) * Sq + i0 + i) * Sk, s, (size_t)Sk * sizeof(float));
            }
            float *yr = y + i0 * a->yi;
            for (i = 0; i + 4 <= rc; i += 4)
                pv_rows(4, sc + i * SkP, SkP, 1, vv, vs, Sk, Dv, yr + i * a->yi, a->yi, a->ye);
            for (; i < rc; i++)
                pv_rows(1, sc + i * SkP, SkP, 1, vv, vs, Sk, Dv, yr + i * a->yi, a->yi, a->ye);
        }
    }
}

void wb_attention_avx2_attention(const int64_t *blk) {
    attend((const call_t *)blk, 0);
}

/* training's forward: the attention's call block followed by one slot, the address of the
 * probabilities' output ((p1 - p0) x Sq x Sk floats, contiguous) */
void wb_attention_avx2_attention_probs(const int64_t *blk) {
    attend((const call_t *)blk, (float *)blk[ATT_SLOTS]);
}

/* training's backward (see attention_avx2.py, ``attention_grad``) */
typedef struct {
    const float *p, *g, *q, *k, *v;
    float *dq, *dk, *dv, *work;
    int64_t H, Sq, Sk, D, Dv;
    int64_t gb, gh, gi, ge, qb, qh, qi, qd, kb, kh, kd, kj, vb, vh, vj, ve;
    int64_t scale_mode, p0, p1;
    double scale;
    const uint8_t *m;                   /* a fill mask's (uint8) values, or NULL */
    int64_t mb, mh, mi, mj, mask_mode;  /* its element strides; 2: filled where non-zero,
                                         * 3: where zero (dS is 0 there, as Where's rule) */
} grad_t;

/* C[i, n] = sum_{k < K} A[i * ai + k * ak] * B[k * bs + n] for i < M, n < N, stored at
 * C + i * cs + n; B's rows hold N rounded up to 8 readable values (zero padding) */
static void small_gemm(const float *A, int64_t ai, int64_t ak, const float *B, int64_t bs,
                       int64_t M, int64_t N, int64_t K, float *C, int64_t cs) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4)
        pv_rows(4, A + i * ai, ai, ak, B, bs, K, N, C + i * cs, cs, 1);
    for (; i < M; i++)
        pv_rows(1, A + i * ai, ai, ak, B, bs, K, N, C + i * cs, cs, 1);
}

void wb_attention_avx2_attention_grad(const int64_t *blk) {
    const grad_t *a = (const grad_t *)blk;
    const int64_t Sq = a->Sq, Sk = a->Sk, D = a->D, Dv = a->Dv, H = a->H;
    const int64_t SkP = (Sk + 7) & ~(int64_t)7, DP = (D + 7) & ~(int64_t)7,
                  DvP = (Dv + 7) & ~(int64_t)7;
    float *vt = a->work;            /* (Dv, SkP): V transposed */
    float *kc = vt + Dv * SkP;      /* (Sk, DP): K (the rows of Kt's columns) */
    float *gc = kc + Sk * DP;       /* (Sq, DvP): dY */
    float *ds = gc + Sq * DvP;      /* (Sq, SkP): dP, then dS */
    const float c = (float)a->scale;
    const int64_t mode = a->scale_mode;
    uint32_t bits;
    memcpy(&bits, &c, 4);
    const uint32_t ex = (bits >> 23) & 0xff;
    /* dividing by a positive power of two (normal inverse) is multiplying by its inverse */
    const int div_exact = mode == 2 && (bits & 0x807fffffu) == 0 && ex > 1 && ex < 253;
    const __m256 inv = _mm256_set1_ps(div_exact ? 1.0f / c : c);
    const __m256 cv = _mm256_set1_ps(c);
    const int mul = mode == 1 || div_exact;
    for (int64_t p = a->p0; p < a->p1; p++) {
        const int64_t b = p / H, h = p % H;
        const float *q = a->q + b * a->qb + h * a->qh;
        const float *k = a->k + b * a->kb + h * a->kh;
        const float *v = a->v + b * a->vb + h * a->vh;
        const float *g = a->g + b * a->gb + h * a->gh;
        const float *pp = a->p + p * Sq * Sk;
        float *dq = a->dq + p * Sq * D;
        float *dk = a->dk + p * D * Sk;
        float *dv = a->dv + p * Sk * Dv;
        for (int64_t e = 0; e < Dv; e++) {
            for (int64_t j = 0; j < Sk; j++)
                vt[e * SkP + j] = v[j * a->vj + e * a->ve];
            for (int64_t j = Sk; j < SkP; j++)
                vt[e * SkP + j] = 0.0f;
        }
        for (int64_t j = 0; j < Sk; j++) {
            for (int64_t d = 0; d < D; d++)
                kc[j * DP + d] = k[d * a->kd + j * a->kj];
            for (int64_t d = D; d < DP; d++)
                kc[j * DP + d] = 0.0f;
        }
        for (int64_t i = 0; i < Sq; i++) {
            for (int64_t e = 0; e < Dv; e++)
                gc[i * DvP + e] = g[i * a->gi + e * a->ge];
            for (int64_t e = Dv; e < DvP; e++)
                gc[i * DvP + e] = 0.0f;
        }
        /* dP = dY V^T (sums over e in order) */
        small_gemm(gc, DvP, 1, vt, SkP, Sq, SkP, Dv, ds, SkP);
        /* dS = P (dP - rowsum(dP P)), then the scale's */
        for (int64_t i = 0; i < Sq; i++) {
            const float *pr = pp + i * Sk;
            float *r = ds + i * SkP;
            __m256 acc = _mm256_setzero_ps();
            for (int64_t j = 0; j < SkP; j += 8) {
                const __m256i m = lanes(Sk - j < 8 ? Sk - j : 8);
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(r + j), _mm256_maskload_ps(pr + j, m), acc);
            }
            const __m256 dot = _mm256_set1_ps(hsum(acc));
            for (int64_t j = 0; j < SkP; j += 8) {
                const __m256i m = lanes(Sk - j < 8 ? Sk - j : 8);
                __m256 t = _mm256_mul_ps(_mm256_maskload_ps(pr + j, m),
                                         _mm256_sub_ps(_mm256_loadu_ps(r + j), dot));
                if (mul)
                    t = _mm256_mul_ps(t, inv);
                else if (mode == 2)
                    t = _mm256_div_ps(t, cv);
                _mm256_storeu_ps(r + j, t);     /* padding columns: P's masked lanes give 0 */
            }
            if (a->mask_mode >= 2) {   /* filled scores take no gradient (Where's rule) */
                const uint8_t *mr = a->m + b * a->mb + h * a->mh + i * a->mi;
                const int want = a->mask_mode == 2;
                for (int64_t j = 0; j < Sk; j++)
                    if ((mr[j * a->mj] != 0) == want)
                        r[j] = 0.0f;
            }
        }
        /* dV = P^T dY (over i), dQ = dS K (over j), dKt = Q^T dS (over i) */
        small_gemm(pp, 1, Sk, gc, DvP, Sk, Dv, Sq, dv, Dv);
        small_gemm(ds, SkP, 1, kc, DP, Sq, D, Sk, dq, D);
        small_gemm(q, a->qd, a->qi, ds, SkP, D, Sk, Sq, dk, Sk);
    }
}
