/* Row-invariant attention over each row's logical key list, for the torch backend's
 * batch-invariant mode on CPU (draftwise/backends/cuda/cpu/native.py builds and loads it).
 *
 * Row i (one query position) of a verify attends over cache slots 0 .. committed-1 and
 * then over its own extra slots extra[i, 0 .. n_extra[i]-1] (its tree ancestors and
 * itself, in depth order): exactly the positions a plain one-row step at the same place
 * sees, in the same order. Every (row, head) is computed by one thread, start to end, in
 * that fixed order, with fixed-width partial sums combined in a fixed order (the AVX-512
 * path runs one head for all rows in a task, sharing the committed prefix's key blocks
 * while they sit in L1, each row's operations unchanged), so its bits
 * never depend on how many rows are verified together, on the other rows, or on the
 * thread count.
 *
 * Shapes: q (T, H, D) float32, already scaled by 1/sqrt(D); cache (2, Hkv, Tmax, D)
 * (one layer: K then V), float32 or, in dw_attention_kv with kv_bf16 = 1, bfloat16 (the
 * 4bit mode's cache: half the bytes a step reads); extra (T, E) int64; n_extra (T,) int32;
 * out (T, H, D).
 *
 * A bfloat16 cache is attended as a bfloat16 model would: on a CPU with avx512_bf16 the
 * scores multiply the keys as they are stored by the query rounded to bfloat16
 * (vdpbf16ps: exact products, float32 sums; no widening), and p @ V, at head sizes 64, 96
 * and 128, multiplies the values as stored by the softmax's weights rounded to bfloat16, two
 * keys an instruction (pv_pairs; other head sizes widen each value exactly and keep two
 * float32 accumulator sets). Its results are within the query's and the weights'
 * rounding of the float32 path over the same values, not bit for bit (both
 * row-invariant). On Zen 5, context 700, a 4-row verify's attention took 0.96-1.03 ms
 * against 1.26-1.29 with every element widened and the float32 path's arithmetic; 8 rows
 * 1.57-1.62 against 2.37-2.44. The weights' pairs (AMD EPYC Zen 4, 2 threads, the default
 * model's 30 layers, context 400): 4 rows 0.90 -> 0.72 ms, 3 rows 0.71 -> 0.64, one row
 * 0.44 -> 0.42; head size 128 at context 300, 4 rows 1.86 -> 1.07; in a live decode
 * (16 Spec-Bench prompts, both alternating) a 4-row verify 5.05 -> 4.86 ms, a one-row
 * step unchanged.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define LANES 16

/* exp(x) for x <= 0 (softmax after subtracting the max): Cody-Waite range reduction and
 * a degree-6 polynomial, about 2 ulp; written with plain arithmetic so the compiler can
 * vectorise it, and deterministic. */
static inline float dw_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float log2e = 1.44269504088896341f;
    float n = (x * log2e + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;                      /* ln2 high part, exact in n*hi */
    r = r - n * -2.12194440e-4f;                         /* ln2 low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } s;
    s.i = ((int32_t)n + 127) << 23;
    return p * s.f;
}

/* Element i of a cache of float32 (bf = 0) or bfloat16 (bf = 1) numbers, as float32. */
static inline float kv_at(const void *base, int64_t i, int bf) {
    if (!bf) return ((const float *)base)[i];
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)((const uint16_t *)base)[i] << 16;
    return c.f;
}

static void one_row_head(const float *qv, const void *K, const void *V, int64_t committed,
                         const int64_t *extra, int64_t n_extra, int d, float *s, float *o,
                         int bf) {
    int64_t len = committed + n_extra;
    float m = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        int64_t k = (j < committed ? j : extra[j - committed]) * d; /* the key's first element */
        float acc[LANES] = {0};
        int x = 0;
        for (; x + LANES <= d; x += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += qv[x + l] * kv_at(K, k + x + l, bf);
        for (int l = 0; x < d; x++, l++) acc[l] += qv[x] * kv_at(K, k + x, bf);
        for (int w = LANES / 2; w > 0; w /= 2) /* fixed pairwise combine */
            for (int l = 0; l < w; l++) acc[l] += acc[l + w];
        s[j] = acc[0];
        m = acc[0] > m ? acc[0] : m;
    }
    for (int64_t j = 0; j < len; j++) s[j] = dw_exp(s[j] - m);
    float sum = 0.0f;
    for (int64_t j = 0; j < len; j++) sum += s[j];
    for (int x = 0; x < d; x++) o[x] = 0.0f;
    for (int64_t j = 0; j < len; j++) {
        int64_t v = (j < committed ? j : extra[j - committed]) * d;
        float p = s[j];
        for (int x = 0; x < d; x++) o[x] += p * kv_at(V, v + x, bf);
    }
    float inv = 1.0f / sum;
    for (int x = 0; x < d; x++) o[x] *= inv;
}

#if defined(__AVX512F__)
#include "vec.h"

/* 16 cache elements from element i on, as float32: a float32 cache (BF = 0, a
 * compile-time constant) or a bfloat16 one (BF = 1), widened exactly. */
static inline __attribute__((always_inline)) __m512 kv16(const void *base, int64_t i, const int BF) {
    if (!BF) return _mm512_loadu_ps((const float *)base + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* NV * 16 bfloat16 elements from element i on, widened to NV float32 vectors in pair
 * order: each whole 32-element chunk c (vectors 2c and 2c + 1) is split into its even
 * elements (32c + 2l in lane l) and its odd ones (32c + 2l + 1), with one shift and one
 * mask (element 2l is the low half of 32-bit lane l) where an in-order widening costs two
 * shuffles per 16; an odd last 16 stay in order. */
static inline __attribute__((always_inline)) void pair_vecs(const uint16_t *base, int64_t i,
                                                            const int NV, __m512 *out) {
    for (int c = 0; c + 1 < NV; c += 2) {
        __m512i x = _mm512_loadu_si512(base + i + 16 * c);
        out[c] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        out[c + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
    }
    if (NV % 2) out[NV - 1] = kv16(base, i + 16 * (NV - 1), 1);
}

/* The values of a key: pair order from a bfloat16 cache (cheaper to widen), in order from
 * a float32 one. p @ V accumulates each output element on its own, so the order is
 * undone once, when the result is stored (store_out). */
static inline __attribute__((always_inline)) void value_vecs(const void *base, int64_t i,
                                                             const int NV, const int BF,
                                                             __m512 *out) {
    if (BF) pair_vecs((const uint16_t *)base, i, NV, out);
    else
        for (int v = 0; v < NV; v++) out[v] = kv16(base, i + 16 * v, 0);
}

/* Store NV vectors in value_vecs' order as the head's D elements in order. */
static inline __attribute__((always_inline)) void store_out(float *o, const __m512 *tv,
                                                            const int NV, const int BF) {
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    int v = 0;
    if (BF)
        for (; v + 1 < NV; v += 2) {
            _mm512_storeu_ps(o + 16 * v, _mm512_permutex2var_ps(tv[v], lo, tv[v + 1]));
            _mm512_storeu_ps(o + 16 * v + 16, _mm512_permutex2var_ps(tv[v], hi, tv[v + 1]));
        }
    for (; v < NV; v++) _mm512_storeu_ps(o + 16 * v, tv[v]);
}

#if defined(__AVX512BF16__)
#define DW_DPBF16 1 /* bfloat16 caches' scores with vdpbf16ps */
#else
#define DW_DPBF16 0 /* AVX-512 without it: every cache widened to float32 */
#endif

/* A query as the scores read it: NV float32 vectors in order (a float32 cache), or, for a
 * bfloat16 cache, rounded to bfloat16 (to nearest even) in 32-element vectors (an odd last
 * 16 zero-padded) for vdpbf16ps. */
typedef struct {
    __m512 f[8];
#if DW_DPBF16
    __m512bh b[4];
#endif
} DwQuery;

static inline __attribute__((always_inline)) void load_query(const float *qv, DwQuery *qq,
                                                             const int NV, const int BF) {
    if (!BF || !DW_DPBF16) {
        for (int v = 0; v < NV; v++) qq->f[v] = _mm512_loadu_ps(qv + 16 * v);
        return;
    }
#if DW_DPBF16
    for (int v = 0; v < NV; v += 2) {
        __m512 lo = _mm512_loadu_ps(qv + 16 * v);
        __m512 hi = v + 1 < NV ? _mm512_loadu_ps(qv + 16 * v + 16) : _mm512_setzero_ps();
        qq->b[v / 2] = _mm512_cvtne2ps_pbh(hi, lo);
    }
#endif
}

/* One key's score, as 16 lanes to be summed: a float32 cache, lane l adds q[x] k[x] for
 * x = l, l + 16, ... (fused multiply-adds in order); a bfloat16 one, lane l adds the pairs
 * (2l, 2l + 1) of each 32-element chunk in order (vdpbf16ps: products exact, each pair
 * added to the lane in turn), reading the cache's bfloat16 as it is: no widening. */
static inline __attribute__((always_inline)) __m512 key_score(const DwQuery *qq,
                                                              const void *K, int64_t k,
                                                              const int NV, const int BF) {
    if (!BF || !DW_DPBF16) {
        __m512 a = _mm512_mul_ps(qq->f[0], kv16(K, k, BF));
        for (int v = 1; v < NV; v++) a = _mm512_fmadd_ps(qq->f[v], kv16(K, k + 16 * v, BF), a);
        return a;
    }
#if DW_DPBF16
    const uint16_t *kb = (const uint16_t *)K + k;
    __m512 a = _mm512_setzero_ps();
    for (int v = 0; v < NV; v += 2) {
        __m512i x = v + 1 < NV ? _mm512_loadu_si512(kb + 16 * v)
                               : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(kb + 16 * v)));
        a = _mm512_dpbf16_ps(a, qq->b[v / 2], (__m512bh)x);
    }
    return a;
#endif
}

/* Scores of 16 keys starting at logical position j for one query. */
static inline __attribute__((always_inline)) __m512 scores16(
    const DwQuery *qq, const void *K, int64_t j, int64_t committed, const int64_t *extra,
    const int NV, const int BF) {
    const int d = 16 * NV;
    __m512 a[16];
    for (int u = 0; u < 16; u++) {
        int64_t jj = j + u;
        int64_t k = (jj < committed ? jj : extra[jj - committed]) * d;
        a[u] = key_score(qq, K, k, NV, BF);
    }
    return sum16x16(a);
}

#if DW_DPBF16
/* p @ V from a bfloat16 cache with vdpbf16ps (dw_attention_pv16(0): the widened values'
 * float32 products instead; the tests compare both). A row's weights p (its scores after
 * the softmax's exp) are rounded to bfloat16, as a bfloat16 model's softmax output is,
 * and taken two keys at a time: logical positions 2k and 2k + 1 of the row's own key
 * list (the last one alone next to a zero), so each vdpbf16ps adds p_2k v_2k + p_2k+1
 * v_2k+1 for 16 output elements (exact products, added in turn) and a key costs half
 * the float32 path's multiply-adds. On a bfloat16 cache only, head sizes 64, 96 and 128. */
static int att_pv16 = 1;

/* Values of keys at slot elements a and b (head size 32 NV2, NV2 a compile-time
 * constant) interleaved: vector 2c + h, 128-bit lane L, float lane q holds the pair
 * (v_a, v_b) of element 32 c + 8 L + 4 h + q (b < 0: zeros in place of v_b). */
static inline __attribute__((always_inline)) void value_pairs(const uint16_t *V, int64_t a,
                                                              int64_t b, const int NV2,
                                                              __m512i *out) {
    for (int c = 0; c < NV2; c++) {
        __m512i x = _mm512_loadu_si512(V + a + 32 * c);
        __m512i y = b >= 0 ? _mm512_loadu_si512(V + b + 32 * c) : _mm512_setzero_si512();
        out[2 * c] = _mm512_unpacklo_epi16(x, y);
        out[2 * c + 1] = _mm512_unpackhi_epi16(x, y);
    }
}

/* The accumulators of value_pairs' order (scaled by inv) stored as the head's elements
 * in order. */
static inline __attribute__((always_inline)) void store_pairs(float *o, const __m512 *acc,
                                                              __m512 inv, const int NV2) {
    /* out elements 0..15 of a 32: lanes L = 0, 1 of vectors 2c (elements 8L..8L+3) and
     * 2c + 1 (8L+4..8L+7); 16..31: lanes 2, 3 */
    const __m512i lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int c = 0; c < NV2; c++) {
        __m512 a = _mm512_mul_ps(acc[2 * c], inv), b = _mm512_mul_ps(acc[2 * c + 1], inv);
        _mm512_storeu_ps(o + 32 * c, _mm512_permutex2var_ps(a, lo, b));
        _mm512_storeu_ps(o + 32 * c + 16, _mm512_permutex2var_ps(a, hi, b));
    }
}

/* Row r's weights as bfloat16 pairs (uint32 k: p_2k low, p_2k+1 high) in place of its
 * first scores; sr[len] is set to 0 first (an odd last key's partner). */
static inline void weight_pairs(float *sr, int64_t len) {
    sr[len] = 0.0f;
    int64_t n = len + 1; /* floats to convert */
    uint32_t *pp = (uint32_t *)sr;
    for (int64_t i = 0; i < n; i += 32) {
        __mmask16 m0 = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __mmask16 m1 = n - i >= 32 ? (__mmask16)0xFFFF
                       : n - i > 16 ? (__mmask16)((1u << (n - i - 16)) - 1) : (__mmask16)0;
        __m512 a = _mm512_maskz_loadu_ps(m0, sr + i), b = _mm512_maskz_loadu_ps(m1, sr + i + 16);
        _mm512_storeu_si512(pp + i / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* head_rows_nv's p @ V on a bfloat16 cache with vdpbf16ps (see att_pv16), NV = 2 NV2. */
static inline __attribute__((always_inline)) void pv_pairs(
    const uint16_t *V, int64_t committed, int64_t shared, const int64_t *extra, int e,
    const int32_t *n_extra, int t, float *s, int64_t lds, float *accs, float *oh, int64_t ld,
    const int NV2) {
    const int d = 32 * NV2, NV = 2 * NV2;
    for (int r = 0; r < t; r++) weight_pairs(s + r * lds, committed + n_extra[r]);
    /* the shared prefix: rows in groups of G, their accumulators in registers */
    const int G = NV2 <= 2 ? 4 : 2;
    for (int r0 = 0; r0 < t; r0 += G) {
        int gn = t - r0 < G ? t - r0 : G;
        __m512 acc[4][8];
        for (int g = 0; g < G; g++)
            for (int v = 0; v < NV; v++) acc[g][v] = _mm512_setzero_ps();
        for (int64_t k = 0; k < shared / 2; k++) {
            if ((k & 3) == 0) { /* values 32 keys ahead, 8 at a time */
                const char *pv = (const char *)(V + (2 * k + 32) * d);
                for (int l = 0; l < 8 * d * 2; l += 64) _mm_prefetch(pv + l, _MM_HINT_T0);
            }
            __m512i vp[8];
            value_pairs(V, 2 * k * d, (2 * k + 1) * d, NV2, vp);
            for (int g = 0; g < G && g < gn; g++) {
                __m512bh pb = (__m512bh)_mm512_set1_epi32(((const int32_t *)(s + (r0 + g) * lds))[k]);
                for (int v = 0; v < NV; v++) acc[g][v] = _mm512_dpbf16_ps(acc[g][v], (__m512bh)vp[v], pb);
            }
        }
        for (int g = 0; g < G && g < gn; g++)
            for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(accs + ((int64_t)(r0 + g) * NV + v) * 16, acc[g][v]);
    }
    /* then each row's own keys, two at a time */
    for (int r = 0; r < t; r++) {
        const int64_t *ex = extra + (int64_t)r * e;
        const float *sr = s + r * lds;
        int64_t len = committed + n_extra[r];
        __m512 acc[8];
        for (int v = 0; v < NV; v++) acc[v] = _mm512_loadu_ps(accs + ((int64_t)r * NV + v) * 16);
        for (int64_t j = shared; j < len; j += 2) {
            int64_t a = (j < committed ? j : ex[j - committed]) * d, b = -1;
            if (j + 1 < len) b = (j + 1 < committed ? j + 1 : ex[j + 1 - committed]) * d;
            __m512i vp[8];
            value_pairs(V, a, b, NV2, vp);
            __m512bh pb = (__m512bh)_mm512_set1_epi32(((const int32_t *)sr)[j / 2]);
            for (int v = 0; v < NV; v++) acc[v] = _mm512_dpbf16_ps(acc[v], (__m512bh)vp[v], pb);
        }
        store_pairs(oh + r * ld, acc, _mm512_set1_ps(sr[lds - 1]), NV2);
    }
}
#endif

/* One head, all T rows, head size 16 NV (a compile-time constant: the query, the output
 * and the accumulators stay in registers). Per (row, head) the arithmetic is fixed by that
 * row's own key list alone:
 * - scores: keys in blocks of 16 from position 0 (each key's key_score, then sum16x16)
 *   while a whole block fits, then the rest one by one;
 * - softmax over the scores (16 lanes, masked tail);
 * - p @ V: key j into accumulator set j % 4 (a float32 cache) or j % 2 (a bfloat16 one),
 *   in increasing j, the sets summed in a fixed order at the end.
 * The blocks inside the committed prefix (shared by every row) are computed for all rows
 * while their 16 keys (or values) sit in L1, or (p @ V from a bfloat16 cache) for groups
 * of rows with their accumulators in registers: the same operations in another order, so
 * the bits are those of the row computed alone. q and out rows are ld floats apart. */
static inline __attribute__((always_inline)) void head_rows_nv(
    const float *qh, int64_t ld, const void *K, const void *V, int64_t committed,
    const int64_t *extra, int e, const int32_t *n_extra, int t, float *s, int64_t lds,
    float *accs, float *oh, const int NV, const int BF) {
    const int d = 16 * NV;
    int64_t shared = committed / 16 * 16;
    DwQuery qq;
    const int elem = BF ? 2 : 4;
    for (int64_t j = 0; j < shared; j += 16) {
        /* the block two ahead into L1: at context 700 a 4-row verify took 3-5% less (Zen 5
         * VM, two alternations); a prefetch past the cache's end is harmless */
        const char *pk = (const char *)K + (j + 32) * d * elem;
        for (int l = 0; l < 16 * d * elem; l += 64) _mm_prefetch(pk + l, _MM_HINT_T0);
        for (int r = 0; r < t; r++) {
            load_query(qh + r * ld, &qq, NV, BF);
            _mm512_storeu_ps(s + r * lds + j, scores16(&qq, K, j, committed, NULL, NV, BF));
        }
    }
    for (int r = 0; r < t; r++) {
        const int64_t *ex = extra + (int64_t)r * e;
        float *sr = s + r * lds;
        int64_t len = committed + n_extra[r], j = shared;
        load_query(qh + r * ld, &qq, NV, BF);
        for (; j + 16 <= len; j += 16) _mm512_storeu_ps(sr + j, scores16(&qq, K, j, committed, ex, NV, BF));
        for (; j < len; j++) {
            int64_t k = (j < committed ? j : ex[j - committed]) * d;
            sr[j] = _mm512_reduce_add_ps(key_score(&qq, K, k, NV, BF));
        }
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (j = 0; j < len; j += 16) {
            __mmask16 msk = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
            mx = _mm512_mask_max_ps(mx, msk, mx, _mm512_maskz_loadu_ps(msk, sr + j));
        }
        __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j < len; j += 16) {
            __mmask16 msk = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
            __m512 ex16 = dw_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, sr + j), m));
            ex16 = _mm512_maskz_mov_ps(msk, ex16);
            _mm512_mask_storeu_ps(sr + j, msk, ex16);
            sum = _mm512_add_ps(sum, ex16);
        }
        sr[lds - 1] = 1.0f / _mm512_reduce_add_ps(sum); /* the row's 1 / sum, kept aside */
    }
#if DW_DPBF16
    if (BF && att_pv16 && NV % 2 == 0) {
        pv_pairs((const uint16_t *)V, committed, shared, extra, e, n_extra, t, s, lds, accs, oh,
                 ld, NV / 2);
        return;
    }
#endif
    if (BF) {
        /* p @ V from a bfloat16 cache: key j into accumulator set j % 2, in increasing j,
         * the two sets summed at the end. Over the shared prefix the rows go in groups of
         * G, each row's 2 NV accumulators held in registers throughout and each value
         * row widened once for the group; then each row's own keys. */
        const int G = NV <= 4 ? 3 : NV == 5 ? 2 : 1;
        for (int r0 = 0; r0 < t; r0 += G) {
            int gn = t - r0 < G ? t - r0 : G;
            __m512 acc[3][2][8];
            for (int g = 0; g < G; g++)
                for (int w = 0; w < 2; w++)
                    for (int v = 0; v < NV; v++) acc[g][w][v] = _mm512_setzero_ps();
            for (int64_t j = 0; j < shared; j += 2)
                for (int w = 0; w < 2; w++) {
                    if (((j + w) & 7) == 0) { /* values 32 ahead, 8 at a time */
                        const char *pv = (const char *)V + (j + w + 32) * d * 2;
                        for (int l = 0; l < 8 * d * 2; l += 64) _mm_prefetch(pv + l, _MM_HINT_T0);
                    }
                    __m512 vx[8];
                    value_vecs(V, (j + w) * d, NV, 1, vx);
                    for (int g = 0; g < G && g < gn; g++) {
                        __m512 p = _mm512_set1_ps(s[(r0 + g) * lds + j + w]);
                        for (int v = 0; v < NV; v++) acc[g][w][v] = _mm512_fmadd_ps(p, vx[v], acc[g][w][v]);
                    }
                }
            for (int g = 0; g < G && g < gn; g++)
                for (int w = 0; w < 2; w++)
                    for (int v = 0; v < NV; v++)
                        _mm512_storeu_ps(accs + ((int64_t)(r0 + g) * 2 * NV + w * NV + v) * 16, acc[g][w][v]);
        }
        for (int r = 0; r < t; r++) {
            const int64_t *ex = extra + (int64_t)r * e;
            const float *sr = s + r * lds;
            const float *ar = accs + (int64_t)r * 2 * NV * 16;
            int64_t len = committed + n_extra[r];
            __m512 acc[2][8], tv[8];
            for (int w = 0; w < 2; w++)
                for (int v = 0; v < NV; v++) acc[w][v] = _mm512_loadu_ps(ar + (w * NV + v) * 16);
            for (int64_t j = shared; j < len; j++) {
                int64_t vv = (j < committed ? j : ex[j - committed]) * d;
                __m512 p = _mm512_set1_ps(sr[j]), vx[8];
                value_vecs(V, vv, NV, 1, vx);
                if (j % 2)
                    for (int v = 0; v < NV; v++) acc[1][v] = _mm512_fmadd_ps(p, vx[v], acc[1][v]);
                else
                    for (int v = 0; v < NV; v++) acc[0][v] = _mm512_fmadd_ps(p, vx[v], acc[0][v]);
            }
            __m512 iv = _mm512_set1_ps(sr[lds - 1]);
            for (int v = 0; v < NV; v++) tv[v] = _mm512_mul_ps(_mm512_add_ps(acc[0][v], acc[1][v]), iv);
            store_out(oh + r * ld, tv, NV, 1);
        }
        return;
    }
    /* p @ V over the shared blocks, all rows, accumulators parked in accs between blocks */
    for (int64_t i = 0; i < (int64_t)t * 4 * NV * 16; i++) accs[i] = 0.0f;
    for (int64_t j = 0; j < shared; j += 16)
        for (int r = 0; r < t; r++) {
            float *ar = accs + (int64_t)r * 4 * NV * 16;
            __m512 acc[4][8];
            for (int w = 0; w < 4; w++)
                for (int v = 0; v < NV; v++) acc[w][v] = _mm512_loadu_ps(ar + (w * NV + v) * 16);
            for (int64_t jj = j; jj < j + 16; jj += 4)
                for (int w = 0; w < 4; w++) {
                    int64_t vv = (jj + w) * d;
                    __m512 p = _mm512_set1_ps(s[r * lds + jj + w]), vx[8];
                    value_vecs(V, vv, NV, 0, vx);
                    for (int v = 0; v < NV; v++) acc[w][v] = _mm512_fmadd_ps(p, vx[v], acc[w][v]);
                }
            for (int w = 0; w < 4; w++)
                for (int v = 0; v < NV; v++) _mm512_storeu_ps(ar + (w * NV + v) * 16, acc[w][v]);
        }
    for (int r = 0; r < t; r++) {
        const int64_t *ex = extra + (int64_t)r * e;
        const float *sr = s + r * lds;
        float *ar = accs + (int64_t)r * 4 * NV * 16;
        int64_t len = committed + n_extra[r], j = shared;
        __m512 acc[4][8];
        for (int w = 0; w < 4; w++)
            for (int v = 0; v < NV; v++) acc[w][v] = _mm512_loadu_ps(ar + (w * NV + v) * 16);
        for (; j + 4 <= len; j += 4)
            for (int w = 0; w < 4; w++) {
                int64_t jj = j + w;
                int64_t vv = (jj < committed ? jj : ex[jj - committed]) * d;
                __m512 p = _mm512_set1_ps(sr[jj]), vx[8];
                value_vecs(V, vv, NV, 0, vx);
                for (int v = 0; v < NV; v++) acc[w][v] = _mm512_fmadd_ps(p, vx[v], acc[w][v]);
            }
        for (int w = 0; j < len; j++, w++) {
            int64_t vv = (j < committed ? j : ex[j - committed]) * d;
            __m512 p = _mm512_set1_ps(sr[j]), vx[8];
            value_vecs(V, vv, NV, 0, vx);
            for (int v = 0; v < NV; v++) acc[w][v] = _mm512_fmadd_ps(p, vx[v], acc[w][v]);
        }
        __m512 iv = _mm512_set1_ps(sr[lds - 1]), tv[8];
        for (int v = 0; v < NV; v++)
            tv[v] = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(acc[0][v], acc[1][v]),
                                                _mm512_add_ps(acc[2][v], acc[3][v])), iv);
        store_out(oh + r * ld, tv, NV, 0);
    }
}

#define NV_CASE(n) case n: \
    if (bf) head_rows_nv(qh, ld, K, V, committed, extra, e, n_extra, t, s, lds, accs, oh, n, 1); \
    else head_rows_nv(qh, ld, K, V, committed, extra, e, n_extra, t, s, lds, accs, oh, n, 0); \
    return 1;
/* The vectorised path for head sizes 64, 80, 96 and 128; 0 for others. */
static int head_rows_vec(const float *qh, int64_t ld, const void *K, const void *V,
                         int64_t committed, const int64_t *extra, int e,
                         const int32_t *n_extra, int t, float *s, int64_t lds, float *accs,
                         float *oh, int d, int bf) {
    if (d % 16) return 0;
    /* the common head sizes 64, 80, 96, 128 (each case is a fully unrolled copy: all 16
     * took 9 s to compile); other sizes take the plain C loop */
    switch (d / 16) { NV_CASE(4) NV_CASE(5) NV_CASE(6) NV_CASE(8) }
    return 0;
}
#elif defined(__AVX2__) && defined(__FMA__)
#include "vec.h"

/* The AVX2 path (no AVX-512: the AMD EPYC Zen 1-3, Intel client CPUs): one (row, head)
 * per task for one row, from two rows the queries of a key/value head in groups
 * (group_rows8); either way a query's arithmetic is fixed by its row's own key list alone:
 * - a key's score: 2 NV 8-lane vectors of q k products (multiply, then fused
 *   multiply-adds in order), its 8 lanes summed in dw_hsum8's order, 8 keys at a time
 *   with dw_sum8x8 (the same additions) while a whole 8 fit, then one by one;
 * - softmax: dw_exp8 of the scores less their maximum, summed in 8 lanes in increasing
 *   position, then dw_hsum8;
 * - p @ V: one accumulator per output element, keys in increasing position.
 * A bfloat16 cache is widened exactly, 16 elements at a time in pair order (even
 * elements: one shift, odd ones: one mask; the query is read in the same order, and the
 * output put back in order once). Head size 16 NV, NV a compile-time constant. */
static inline __attribute__((always_inline)) void kv_vecs8(const void *base, int64_t i,
                                                           const int NV, const int BF,
                                                           __m256 *out) {
    for (int c = 0; c < NV; c++) {
        if (BF) {
            __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i + 16 * c));
            out[2 * c] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
            out[2 * c + 1] = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
        } else {
            out[2 * c] = _mm256_loadu_ps((const float *)base + i + 16 * c);
            out[2 * c + 1] = _mm256_loadu_ps((const float *)base + i + 16 * c + 8);
        }
    }
}

static inline __attribute__((always_inline)) __m256 key_score8(const __m256 *qv, const void *K,
                                                              int64_t k, const int NV,
                                                              const int BF) {
    __m256 kx[16];
    kv_vecs8(K, k, NV, BF, kx);
    __m256 a = _mm256_mul_ps(qv[0], kx[0]);
    for (int v = 1; v < 2 * NV; v++) a = _mm256_fmadd_ps(qv[v], kx[v], a);
    return a;
}

/* A query (16 NV,) as 2 NV vectors, in the keys' pair order for a bfloat16 cache. */
static inline __attribute__((always_inline)) void query_vecs8(const float *qv, const int NV,
                                                              const int BF, __m256 *qq) {
    if (BF)
        for (int c = 0; c < NV; c++) {
            __m256 a = _mm256_loadu_ps(qv + 16 * c), b = _mm256_loadu_ps(qv + 16 * c + 8);
            __m256 ev = _mm256_shuffle_ps(a, b, 0x88), od = _mm256_shuffle_ps(a, b, 0xDD);
            qq[2 * c] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
            qq[2 * c + 1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8));
        }
    else
        for (int v = 0; v < 2 * NV; v++) qq[v] = _mm256_loadu_ps(qv + 8 * v);
}

/* Scores s (len,) -> dw_exp8 of each less their maximum, in place (s has room for 8 past
 * len: the tail's lanes become 0); returns their sum in 8 lanes, in increasing position. */
static inline __m256 exp_scores8(float *s, int64_t len) {
    int64_t j;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (j = 0; j + 8 <= len; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    float m = -INFINITY;
    for (; j < len; j++) m = s[j] > m ? s[j] : m;
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    m = _mm_cvtss_f32(m4) > m ? _mm_cvtss_f32(m4) : m;
    const __m256 mm = _mm256_set1_ps(m);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j < len; j += 8) {
        __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(len - j)), iota));
        __m256 e8 = _mm256_and_ps(dw_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mm)), keep);
        _mm256_storeu_ps(s + j, e8);
        sum = _mm256_add_ps(sum, e8);
    }
    return sum;
}

/* Output elements 16 c .. 16 c + 15 from their two accumulators (pair order back to
 * element order for a bfloat16 cache). */
static inline __attribute__((always_inline)) void store_out8(float *o, __m256 a, __m256 b,
                                                             const int BF) {
    if (BF) {
        __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
        a = _mm256_permute2f128_ps(lo, hi, 0x20);
        b = _mm256_permute2f128_ps(lo, hi, 0x31);
    }
    _mm256_storeu_ps(o, a);
    _mm256_storeu_ps(o + 8, b);
}

static inline __attribute__((always_inline)) void row_head8(
    const float *qv, const void *K, const void *V, int64_t committed, const int64_t *ex,
    int64_t n_extra, float *s, float *o, const int NV, const int BF) {
    const int d = 16 * NV;
    int64_t len = committed + n_extra, j = 0;
    __m256 qq[16];
    query_vecs8(qv, NV, BF, qq);
    for (; j + 8 <= len; j += 8) {
        __m256 a[8];
        for (int u = 0; u < 8; u++) {
            int64_t jj = j + u;
            a[u] = key_score8(qq, K, (jj < committed ? jj : ex[jj - committed]) * d, NV, BF);
        }
        _mm256_storeu_ps(s + j, dw_sum8x8(a));
    }
    for (; j < len; j++)
        s[j] = dw_hsum8(key_score8(qq, K, (j < committed ? j : ex[j - committed]) * d, NV, BF));
    __m256 sum = exp_scores8(s, len);
    __m256 acc[16];
    for (int v = 0; v < 2 * NV; v++) acc[v] = _mm256_setzero_ps();
    for (j = 0; j < len; j++) {
        __m256 p = _mm256_set1_ps(s[j]), vx[16];
        kv_vecs8(V, (j < committed ? j : ex[j - committed]) * d, NV, BF, vx);
        for (int v = 0; v < 2 * NV; v++) acc[v] = _mm256_fmadd_ps(p, vx[v], acc[v]);
    }
    __m256 inv = _mm256_set1_ps(1.0f / dw_hsum8(sum));
    for (int c = 0; c < NV; c++)
        store_out8(o + 16 * c, _mm256_mul_ps(acc[2 * c], inv), _mm256_mul_ps(acc[2 * c + 1], inv), BF);
}

#define NV8_CASE(n) case n: \
    if (bf) row_head8(qv, K, V, committed, ex, n_extra, s, o, n, 1); \
    else row_head8(qv, K, V, committed, ex, n_extra, s, o, n, 0); \
    return;
/* Head sizes 64, 80, 96 and 128 (dw_attention_kv checks). */
static void row_head_avx2(const float *qv, const void *K, const void *V, int64_t committed,
                          const int64_t *ex, int64_t n_extra, int d, float *s, float *o,
                          int bf) {
    switch (d / 16) { NV8_CASE(4) NV8_CASE(5) NV8_CASE(6) NV8_CASE(8) }
}

#define QMAX 4
#define PF_KEYS 16 /* keys and values are prefetched this many positions ahead */
/* Prefetch the cache lines of one key or value (16 NV elements from element i); past
 * the cache's end a prefetch is harmless. */
static inline __attribute__((always_inline)) void prefetch_rows8(const void *base, int64_t i,
                                                                 const int NV, const int BF) {
    const char *p = (const char *)base + i * (BF ? 2 : 4);
    for (int l = 0; l < 16 * NV * (BF ? 2 : 4); l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
}

/* Up to QMAX queries that share one key/value head (the rows of a verify, and the query
 * heads of a grouped-query head), together: each key and value is widened once for all of
 * them, where row_head8 widens it once a query. Every query's arithmetic is row_head8's
 * op for op (its scores: the same products, dw_sum8x8 being dw_hsum8 lane by lane; its
 * softmax; its p @ V: one accumulator per output element, keys in increasing position),
 * so its bits are the same as alone (tests/backends/cuda/cpu/test_native.py compares
 * both paths bit for bit). Query i: qv[i] (16 NV,), its own extra keys
 * ex[i] (n_ex[i],), scores s[i] (committed + n_ex[i] + 8 floats of room), output o[i].
 * The committed keys and values are prefetched PF_KEYS ahead: with the step's weights
 * streaming past, they come from memory (without the prefetch, a first version with 3
 * queries a group was slower than one (row, head) a task with the caches flushed before
 * each call; with it, at context 1,024, 4.5 / 7.65 ms for 30 layers at 2 / 4 rows
 * against 5.59 / 10.18). */
static inline __attribute__((always_inline)) void group_rows8(
    const float *const *qv, const int64_t *const *ex, const int64_t *n_ex, const int nq,
    const void *K, const void *V, int64_t committed, float *const *s, float *const *o,
    const int NV, const int BF) {
    const int d = 16 * NV;
    __m256 qq[QMAX][16];
    for (int i = 0; i < nq; i++) query_vecs8(qv[i], NV, BF, qq[i]);
    /* Query i's run[i] first extras are the slots right after the committed ones (a
     * prompt's chunk, a chain's rows): with them its list starts with slots 0 .. L[i] - 1,
     * shared with the group's other queries up to their own L, like the committed ones
     * (the same keys in the same order: the same bits). Before, each query scored its
     * extras one by one: on an AMD EPYC Zen 3 (2 threads, 30 layers, bfloat16 cache,
     * medians of 7, in-process) a 256-row prompt chunk on an empty cache took 57-79 ms,
     * now 32-48; at 256 committed 120-129 ms, now 98-135 (noisy); a 4-row chain at 700
     * committed 4.4-5.2 ms, now 4.0-4.05. */
    int64_t run[QMAX], L[QMAX], lo = INT64_MAX, hi = 0;
    for (int i = 0; i < nq; i++) {
        int64_t x = 0;
        while (x < n_ex[i] && ex[i][x] == committed + x) x++;
        run[i] = x;
        L[i] = committed + x;
        lo = L[i] < lo ? L[i] : lo;
        hi = L[i] > hi ? L[i] : hi;
    }
    /* scores over the shared slots 0 .. hi - 1: 8 keys a block, each widened once (a
     * query past its own L scores a few keys it then overwrites or leaves unread: s has
     * room for committed + the most extras + 16) */
    int64_t j = 0;
    for (; j + 8 <= hi; j += 8) {
        __m256 a[QMAX][8];
#pragma GCC unroll 1
        for (int u = 0; u < 8; u++) {
            __m256 kx[16];
            prefetch_rows8(K, (j + u + PF_KEYS) * d, NV, BF);
            kv_vecs8(K, (j + u) * d, NV, BF, kx);
            for (int i = 0; i < nq; i++) {
                __m256 acc = _mm256_mul_ps(qq[i][0], kx[0]);
                for (int v = 1; v < 2 * NV; v++) acc = _mm256_fmadd_ps(qq[i][v], kx[v], acc);
                a[i][u] = acc;
            }
        }
        for (int i = 0; i < nq; i++) _mm256_storeu_ps(s[i] + j, dw_sum8x8(a[i]));
    }
    for (; j < hi; j++) {
        __m256 kx[16];
        kv_vecs8(K, j * d, NV, BF, kx);
        for (int i = 0; i < nq; i++) {
            __m256 acc = _mm256_mul_ps(qq[i][0], kx[0]);
            for (int v = 1; v < 2 * NV; v++) acc = _mm256_fmadd_ps(qq[i][v], kx[v], acc);
            s[i][j] = dw_hsum8(acc);
        }
    }
    __m256 sums[QMAX];
    for (int i = 0; i < nq; i++) { /* each query's other keys, then its softmax */
        for (int64_t x = run[i]; x < n_ex[i]; x++)
            s[i][committed + x] = dw_hsum8(key_score8(qq[i], K, ex[i][x] * d, NV, BF));
        sums[i] = exp_scores8(s[i], committed + n_ex[i]);
    }
    /* p @ V, CH blocks of 16 output elements at a time: at least 8 accumulators a pass
     * (2 CH nq), so that a key's fused multiply-adds do not wait on the last key's */
    const int CH = nq == 1 ? NV : nq == 2 ? 2 : 1;
    for (int c0 = 0; c0 < NV; c0 += CH) {
        const int cw = NV - c0 < CH ? NV - c0 : CH;
        __m256 acc[QMAX][16];
        for (int i = 0; i < nq; i++)
            for (int v = 0; v < 2 * cw; v++) acc[i][v] = _mm256_setzero_ps();
        for (j = 0; j < lo; j++) {
            __m256 vx[16];
            if (c0 == 0) prefetch_rows8(V, (j + PF_KEYS) * d, NV, BF);
            kv_vecs8(V, j * d + 16 * c0, cw, BF, vx);
            for (int i = 0; i < nq; i++) {
                __m256 p = _mm256_set1_ps(s[i][j]);
                for (int v = 0; v < 2 * cw; v++) acc[i][v] = _mm256_fmadd_ps(p, vx[v], acc[i][v]);
            }
        }
        for (; j < hi; j++) { /* the shared slots some queries' lists stop before */
            __m256 vx[16];
            kv_vecs8(V, j * d + 16 * c0, cw, BF, vx);
            for (int i = 0; i < nq; i++) {
                if (j >= L[i]) continue;
                __m256 p = _mm256_set1_ps(s[i][j]);
                for (int v = 0; v < 2 * cw; v++) acc[i][v] = _mm256_fmadd_ps(p, vx[v], acc[i][v]);
            }
        }
        for (int i = 0; i < nq; i++) {
            for (int64_t x = run[i]; x < n_ex[i]; x++) {
                __m256 vx[16], p = _mm256_set1_ps(s[i][committed + x]);
                kv_vecs8(V, ex[i][x] * d + 16 * c0, cw, BF, vx);
                for (int v = 0; v < 2 * cw; v++) acc[i][v] = _mm256_fmadd_ps(p, vx[v], acc[i][v]);
            }
            __m256 inv = _mm256_set1_ps(1.0f / dw_hsum8(sums[i]));
            for (int c = 0; c < cw; c++)
                store_out8(o[i] + 16 * (c0 + c), _mm256_mul_ps(acc[i][2 * c], inv),
                           _mm256_mul_ps(acc[i][2 * c + 1], inv), BF);
        }
    }
}

#define GQ_CASE(n, q) case n: \
    if (bf) group_rows8(qv, ex, n_ex, q, K, V, committed, s, o, n, 1); \
    else group_rows8(qv, ex, n_ex, q, K, V, committed, s, o, n, 0); \
    break;
#define GQ_NV(q) \
    switch (d / 16) { GQ_CASE(4, q) GQ_CASE(8, q) } \
    qv += q; ex += q; n_ex += q; s += q; o += q; nq -= q;
/* group_rows8 over nq queries, 4 or 2 at a time, a last single one by row_head_avx2
 * (the bits are the same either way); head sizes 64 and 128. Each count, head size and
 * cache dtype is a copy of its own, and the kernels' build time grows with them: with
 * counts 2 to 4 and the four head sizes of row_head_avx2 the build took twice as long. */
static void group_rows_avx2(const float *const *qv, const int64_t *const *ex,
                            const int64_t *n_ex, int nq, const void *K, const void *V,
                            int64_t committed, float *const *s, float *const *o, int d, int bf) {
    while (nq >= 2) {
        if (nq >= 4) {
            GQ_NV(4)
        } else {
            GQ_NV(2)
        }
    }
    if (nq == 1)
        row_head_avx2(qv[0], K, V, committed, ex[0], n_ex[0], d, s[0], o[0], bf);
}
#endif


#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
static int att_grouped = 1; /* dw_attention_group(0): one (row, head) a task (tests) */
#endif

/* The AVX2 path's query grouping for verifies of two rows or more (group_rows8): ``on``
 * 1 or 0 sets it (-1 leaves it); returns 1 where this build has that path (AVX2 without
 * AVX-512), else 0. Either way a query gets the same bits (the tests compare them). */
int dw_attention_group(int on) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
    if (on >= 0) att_grouped = on != 0;
    return 1;
#else
    (void)on;
    return 0;
#endif
}

/* p @ V on a bfloat16 cache with vdpbf16ps (att_pv16): ``on`` 1 or 0 sets it (-1 leaves
 * it); returns 1 where this build has that path and it is on, else 0. */
int dw_attention_pv16(int on) {
#if defined(__AVX512F__) && DW_DPBF16
    if (on >= 0) att_pv16 = on != 0;
    return att_pv16;
#else
    (void)on;
    return 0;
#endif
}

/* 1 when this build scores a bfloat16 cache with vdpbf16ps (the query rounded to
 * bfloat16), 0 when it widens every element (no avx512_bf16, or no AVX-512). */
int dw_attention_dpbf16(void) {
#if defined(__AVX512F__)
    return DW_DPBF16;
#else
    return 0;
#endif
}

static int att_runs = 1; /* dw_attention_runs(0): all of a head's rows in one task (tests) */

#if defined(__AVX512F__)
/* Task ``task`` of dw_attention_kv's AVX-512 path: head task / nch, its rows r0 .. r0 +
 * rc - 1 (r0 = (task % nch) rc, fewer at the end), through head_rows_vec. */
static void head_run(const float *q, const void *cache, size_t elem, int64_t tmax, int h,
                     int hkv, int rep, int d, int64_t committed, const int64_t *extra, int e,
                     const int32_t *n_extra, int t, int rc, int nch, int64_t task, float *s,
                     int64_t lds, float *accs, float *out, int bf) {
    int hh = (int)(task / nch), r0 = (int)(task % nch) * rc;
    int rn = t - r0 < rc ? t - r0 : rc;
    int g = hh / rep;
    const char *K = (const char *)cache + (size_t)g * tmax * d * elem;
    const char *V = (const char *)cache + (size_t)(hkv + g) * tmax * d * elem;
    int64_t at = (int64_t)r0 * h * d + (int64_t)hh * d; /* row r0, head hh */
    head_rows_vec(q + at, (int64_t)h * d, K, V, committed, extra + (int64_t)r0 * e, e,
                  n_extra + r0, rn, s, lds, accs, out + at, d, bf);
}
#endif

/* The AVX-512 path's runs of rows (above): ``on`` 1 or 0 sets it (-1 leaves it); returns
 * the setting. Either way a query gets the same bits (the tests compare them). */
int dw_attention_runs(int on) {
    if (on >= 0) att_runs = on != 0;
    return att_runs;
}

/* The attention over a float32 (kv_bf16 = 0) or bfloat16 (kv_bf16 = 1) cache. */
int dw_attention_kv(const float *q, const void *cache, int kv_bf16, int64_t tmax, int h,
                    int hkv, int d, int64_t committed, const int64_t *extra,
                    const int32_t *n_extra, int t, int e, float *out, int threads) {
    const int bf = kv_bf16 != 0;
    const size_t elem = bf ? sizeof(uint16_t) : sizeof(float);
    int rep = h / hkv;
    int64_t most = 0;
    for (int i = 0; i < t; i++) most = n_extra[i] > most ? n_extra[i] : most;
    int failed = 0;
#if defined(__AVX512F__)
    if (d == 64 || d == 80 || d == 96 || d == 128) { /* one head, a run of rows, per task */
        int64_t lds = committed + most + 17; /* scores, padding, the row's 1 / sum last */
        /* A prompt chunk's rows in runs of rc (16 or more) a task, so that there are
         * more tasks than heads: with one run of all rows a head (9 tasks for SmolLM2) one
         * thread took 5 heads and the other 4. A row's operations do not depend on the
         * run it is in (its key blocks are the same; only how many rows share them while
         * they sit in L1). A verify's few rows stay in one run: split into runs of one
         * row, a 4-row verify took 8% longer (each run reads the head's keys again). */
        int rc = t;
        if (att_runs && t >= 32 && threads > 1) {
            int64_t want = (int64_t)t * h / (8 * (int64_t)threads);
            rc = want < 16 ? 16 : want > t ? t : (int)want;
        }
        int nch = (t + rc - 1) / rc;
        int64_t tasks = (int64_t)h * nch;
#pragma omp parallel num_threads(threads) if (threads > 1 && tasks > 1)
        {
            float *s = (float *)malloc(sizeof(float) * (size_t)(rc * lds));
            float *accs = (float *)malloc(sizeof(float) * (size_t)rc * 4 * 256);
            if (s == NULL || accs == NULL) {
#pragma omp atomic write
                failed = 1;
            }
            if (nch == 1) { /* a verify: a head a task, as before the runs (static) */
#pragma omp for schedule(static)
                for (int64_t task = 0; task < tasks; task++)
                    if (s != NULL && accs != NULL)
                        head_run(q, cache, elem, tmax, h, hkv, rep, d, committed, extra, e,
                                 n_extra, t, rc, nch, task, s, lds, accs, out, bf);
            } else { /* a prompt chunk's runs, as the threads come free */
#pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < tasks; task++)
                    if (s != NULL && accs != NULL)
                        head_run(q, cache, elem, tmax, h, hkv, rep, d, committed, extra, e,
                                 n_extra, t, rc, nch, task, s, lds, accs, out, bf);
            }
            free(s);
            free(accs);
        }
        return failed;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
    const int vec = d == 64 || d == 80 || d == 96 || d == 128;
    if ((d == 64 || d == 128) && att_grouped && t > 1) {
        /* the AVX2 path from two rows on: a kv head's n = t rep queries in k parts of
         * QMAX (the last may be smaller), or of 2 where that gives too few tasks for two a
         * thread (neither a part's size nor the path changes a query's bits:
         * group_rows8). The 4bit forward's verify on an AMD EPYC Zen 3 (2 threads, the
         * two paths alternated, medians of 150): 2 / 3 / 4 rows 0.99 / 0.97 / 0.95x at
         * context 1,024, 0.97 / 0.93 / 0.94x at 1,800, within 2% at 256. One row keeps
         * the (row, head) tasks: grouped (3 queries a group), it took 2-5% longer at
         * contexts 1,024-1,800. */
        int n = t * rep, part_q = QMAX, k = (n + QMAX - 1) / QMAX;
        if (hkv * k < 2 * threads) { /* parts of 2 queries (group_rows_avx2's other size) */
            part_q = 2;
            k = (n + 1) / 2;
        }
        int64_t lds = committed + most + 16, tasks = (int64_t)hkv * k;
#pragma omp parallel num_threads(threads) if (threads > 1 && tasks > 1)
        {
            float *sb = (float *)malloc(sizeof(float) * (size_t)(QMAX * lds));
            if (sb == NULL) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < tasks; task++) {
                if (sb == NULL) continue;
                int g = (int)(task / k), part = (int)(task % k);
                int q0 = part * part_q, q1 = q0 + part_q < n ? q0 + part_q : n;
                const float *qv[QMAX];
                const int64_t *ex[QMAX];
                int64_t n_ex[QMAX];
                float *sv[QMAX], *ov[QMAX];
                for (int x = q0; x < q1; x++) { /* query x: head g rep + x / t, row x % t */
                    int i = x % t, hh = g * rep + x / t;
                    qv[x - q0] = q + ((int64_t)i * h + hh) * d;
                    ov[x - q0] = out + ((int64_t)i * h + hh) * d;
                    ex[x - q0] = extra + (int64_t)i * e;
                    n_ex[x - q0] = n_extra[i];
                    sv[x - q0] = sb + (int64_t)(x - q0) * lds;
                }
                const char *K = (const char *)cache + (size_t)g * tmax * d * elem;
                const char *V = (const char *)cache + (size_t)(hkv + g) * tmax * d * elem;
                group_rows_avx2(qv, ex, n_ex, q1 - q0, K, V, committed, sv, ov, d, bf);
            }
            free(sb);
        }
        return failed;
    }
#else
    const int vec = 0;
#endif
    /* (row, head) tasks, head by head: the AVX2 path's for head sizes 64, 80, 96 and 128
     * with grouping off (dw_attention_group(0)), else the plain loops */
    int64_t total = (int64_t)t * h;
#pragma omp parallel num_threads(threads) if (threads > 1 && total > 1)
    {
        float *s = (float *)malloc(sizeof(float) * (size_t)(committed + most + 16));
        if (s == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t th = 0; th < total; th++) {
            if (s == NULL) continue;
            int i = (int)(th % t), hh = (int)(th / t), g = hh / rep;
            const char *K = (const char *)cache + (size_t)g * tmax * d * elem;
            const char *V = (const char *)cache + (size_t)(hkv + g) * tmax * d * elem;
            const float *qv = q + ((int64_t)i * h + hh) * d;
            float *ov = out + ((int64_t)i * h + hh) * d;
            if (vec) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
                row_head_avx2(qv, K, V, committed, extra + (int64_t)i * e, n_extra[i], d, s, ov, bf);
                continue;
#endif
            }
            one_row_head(qv, K, V, committed, extra + (int64_t)i * e, n_extra[i], d, s, ov, bf);
        }
        free(s);
    }
    return failed;
}

/* The attention over a float32 cache (dw_attention_kv with kv_bf16 = 0). */
int dw_attention(const float *q, const float *cache, int64_t tmax, int h, int hkv, int d,
                 int64_t committed, const int64_t *extra, const int32_t *n_extra, int t,
                 int e, float *out, int threads) {
    return dw_attention_kv(q, cache, 0, tmax, h, hkv, d, committed, extra, n_extra, t, e, out,
                           threads);
}
