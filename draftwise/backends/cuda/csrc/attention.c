/* Row-invariant attention over each row's logical key list, for the torch backend's
 * batch-invariant mode on CPU (draftwise/backends/cuda/native.py builds and loads it).
 *
 * Row i (one query position) of a verify attends over cache slots 0 .. committed-1 and
 * then over its own extra slots extra[i, 0 .. n_extra[i]-1] (its tree ancestors and
 * itself, in depth order): exactly the positions a plain one-row step at the same place
 * sees, in the same order. Every (row, head) is computed by one thread, start to end, in
 * that fixed order, with fixed-width partial sums combined in a fixed order, so its bits
 * never depend on how many rows are verified together, on the other rows, or on the
 * thread count.
 *
 * Shapes: q (T, H, D) float32, already scaled by 1/sqrt(D); cache (2, Hkv, Tmax, D)
 * float32 (one layer: K then V); extra (T, E) int64; n_extra (T,) int32; out (T, H, D).
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

static void one_row_head(const float *qv, const float *K, const float *V, int64_t committed,
                         const int64_t *extra, int64_t n_extra, int d, float *s, float *o) {
    int64_t len = committed + n_extra;
    float m = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        int64_t slot = j < committed ? j : extra[j - committed];
        const float *k = K + slot * d;
        float acc[LANES] = {0};
        int x = 0;
        for (; x + LANES <= d; x += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += qv[x + l] * k[x + l];
        for (int l = 0; x < d; x++, l++) acc[l] += qv[x] * k[x];
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
        int64_t slot = j < committed ? j : extra[j - committed];
        const float *v = V + slot * d;
        float p = s[j];
        for (int x = 0; x < d; x++) o[x] += p * v[x];
    }
    float inv = 1.0f / sum;
    for (int x = 0; x < d; x++) o[x] *= inv;
}

#if defined(__AVX512F__)
#include "vec.h"

/* 16 vectors -> one: lane u of the result is the sum of a[u]'s 16 lanes (a fixed
 * transpose-and-add tree). */
static inline __m512 sum16x16(const __m512 *a) {
    __m512 b[8], c[4];
    for (int u = 0; u < 8; u++)
        b[u] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * u], a[2 * u + 1]),
                             _mm512_unpackhi_ps(a[2 * u], a[2 * u + 1]));
    for (int u = 0; u < 4; u++) {
        __m512d x = _mm512_castps_pd(b[2 * u]), y = _mm512_castps_pd(b[2 * u + 1]);
        c[u] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* each 128-bit lane of c[u] now holds keys 4u..4u+3, partial over that lane */
    __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

/* one_row_head for head sizes 16 NV (NV a compile-time constant, so the query, the output
 * and the accumulators stay in registers). Scores: keys 16 at a time, each key's NV
 * fused multiply-adds then sum16x16; the keys after the last full 16 one by one. p @ V:
 * four accumulator sets (key j into set j % 4) summed in a fixed order at the end. Per
 * (row, head) the instruction sequence depends only on that row's own key list. */
static inline __attribute__((always_inline)) void row_head_nv(
    const float *qv, const float *K, const float *V, int64_t committed, const int64_t *extra,
    int64_t n_extra, float *s, float *o, const int NV) {
    const int d = 16 * NV;
    int64_t len = committed + n_extra;
    __m512 q[NV];
    for (int v = 0; v < NV; v++) q[v] = _mm512_loadu_ps(qv + 16 * v);
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
        __m512 a[16];
        for (int u = 0; u < 16; u++) {
            int64_t jj = j + u;
            const float *k = K + (jj < committed ? jj : extra[jj - committed]) * d;
            a[u] = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
            for (int v = 1; v < NV; v++) a[u] = _mm512_fmadd_ps(q[v], _mm512_loadu_ps(k + 16 * v), a[u]);
        }
        _mm512_storeu_ps(s + j, sum16x16(a));
    }
    for (; j < len; j++) {
        const float *k = K + (j < committed ? j : extra[j - committed]) * d;
        __m512 a = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
        for (int v = 1; v < NV; v++) a = _mm512_fmadd_ps(q[v], _mm512_loadu_ps(k + 16 * v), a);
        s[j] = _mm512_reduce_add_ps(a);
    }
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (j = 0; j < len; j += 16) {
        __mmask16 msk = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
        mx = _mm512_mask_max_ps(mx, msk, mx, _mm512_maskz_loadu_ps(msk, s + j));
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j < len; j += 16) {
        __mmask16 msk = len - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - j)) - 1);
        __m512 e = dw_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, s + j), m));
        e = _mm512_maskz_mov_ps(msk, e);
        _mm512_mask_storeu_ps(s + j, msk, e);
        sum = _mm512_add_ps(sum, e);
    }
    float inv = 1.0f / _mm512_reduce_add_ps(sum);
    __m512 acc[4][NV];
    for (int w = 0; w < 4; w++)
        for (int v = 0; v < NV; v++) acc[w][v] = _mm512_setzero_ps();
    for (j = 0; j + 4 <= len; j += 4)
        for (int w = 0; w < 4; w++) {
            int64_t jj = j + w;
            const float *vv = V + (jj < committed ? jj : extra[jj - committed]) * d;
            __m512 p = _mm512_set1_ps(s[jj]);
            for (int v = 0; v < NV; v++) acc[w][v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vv + 16 * v), acc[w][v]);
        }
    for (int w = 0; j < len; j++, w++) {
        const float *vv = V + (j < committed ? j : extra[j - committed]) * d;
        __m512 p = _mm512_set1_ps(s[j]);
        for (int v = 0; v < NV; v++) acc[w][v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vv + 16 * v), acc[w][v]);
    }
    __m512 iv = _mm512_set1_ps(inv);
    for (int v = 0; v < NV; v++) {
        __m512 t = _mm512_add_ps(_mm512_add_ps(acc[0][v], acc[1][v]), _mm512_add_ps(acc[2][v], acc[3][v]));
        _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(t, iv));
    }
}

#define NV_CASE(n) case n: row_head_nv(qv, K, V, committed, extra, n_extra, s, o, n); return 1;
/* The vectorised path for head sizes 16..256 in steps of 16; 0 when d is not one. */
static int one_row_head_vec(const float *qv, const float *K, const float *V,
                            int64_t committed, const int64_t *extra, int64_t n_extra, int d,
                            float *s, float *o) {
    if (d % 16) return 0;
    switch (d / 16) {
        NV_CASE(1) NV_CASE(2) NV_CASE(3) NV_CASE(4) NV_CASE(5) NV_CASE(6) NV_CASE(7)
        NV_CASE(8) NV_CASE(9) NV_CASE(10) NV_CASE(11) NV_CASE(12) NV_CASE(13) NV_CASE(14)
        NV_CASE(15) NV_CASE(16)
    }
    return 0;
}
#endif

int dw_attention(const float *q, const float *cache, int64_t tmax, int h, int hkv, int d,
                 int64_t committed, const int64_t *extra, const int32_t *n_extra, int t,
                 int e, float *out, int threads) {
    int rep = h / hkv;
    int64_t most = 0;
    for (int i = 0; i < t; i++) most = n_extra[i] > most ? n_extra[i] : most;
    int64_t total = (int64_t)t * h;
    int failed = 0;
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
            int i = (int)(th / h), hh = (int)(th % h), g = hh / rep;
            const float *K = cache + ((int64_t)g * tmax) * d;
            const float *V = cache + ((int64_t)(hkv + g) * tmax) * d;
#if defined(__AVX512F__)
            if (one_row_head_vec(q + th * d, K, V, committed, extra + (int64_t)i * e,
                                 n_extra[i], d, s, out + th * d))
                continue;
#endif
            one_row_head(q + th * d, K, V, committed, extra + (int64_t)i * e, n_extra[i], d, s,
                         out + th * d);
        }
        free(s);
    }
    return failed;
}
