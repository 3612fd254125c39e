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
#include <immintrin.h>
#define MAX_VECS 16 /* head sizes up to 256 */

/* dw_exp on 16 lanes: the same arithmetic, lane by lane. */
static inline __m512 dw_exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 shift = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), shift), shift);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* one_row_head for head sizes that are multiples of 16: the query and the output live in
 * registers, each key's dot product is nv fused multiply-adds and one fixed-order
 * horizontal sum, softmax and p @ V run 16 lanes at a time. Per (row, head) the
 * instruction sequence depends only on that row's own key list. */
static void one_row_head_vec(const float *qv, const float *K, const float *V,
                             int64_t committed, const int64_t *extra, int64_t n_extra,
                             int d, float *s, float *o) {
    int64_t len = committed + n_extra;
    int nv = d / 16;
    __m512 q[MAX_VECS];
    for (int v = 0; v < nv; v++) q[v] = _mm512_loadu_ps(qv + 16 * v);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
        __m512 a[4];
        for (int u = 0; u < 4; u++) {
            int64_t jj = j + u;
            const float *k = K + (jj < committed ? jj : extra[jj - committed]) * d;
            a[u] = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
            for (int v = 1; v < nv; v++) a[u] = _mm512_fmadd_ps(q[v], _mm512_loadu_ps(k + 16 * v), a[u]);
        }
        for (int u = 0; u < 4; u++) s[j + u] = _mm512_reduce_add_ps(a[u]);
    }
    for (; j < len; j++) {
        const float *k = K + (j < committed ? j : extra[j - committed]) * d;
        __m512 a = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
        for (int v = 1; v < nv; v++) a = _mm512_fmadd_ps(q[v], _mm512_loadu_ps(k + 16 * v), a);
        s[j] = _mm512_reduce_add_ps(a);
    }
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
    __m512 acc[MAX_VECS];
    for (int v = 0; v < nv; v++) acc[v] = _mm512_setzero_ps();
    for (j = 0; j < len; j++) {
        const float *vv = V + (j < committed ? j : extra[j - committed]) * d;
        __m512 p = _mm512_set1_ps(s[j]);
        for (int v = 0; v < nv; v++) acc[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vv + 16 * v), acc[v]);
    }
    __m512 iv = _mm512_set1_ps(inv);
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(acc[v], iv));
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
            if (d % 16 == 0 && d <= 16 * MAX_VECS) {
                one_row_head_vec(q + th * d, K, V, committed, extra + (int64_t)i * e, n_extra[i],
                                 d, s, out + th * d);
                continue;
            }
#endif
            one_row_head(q + th * d, K, V, committed, extra + (int64_t)i * e, n_extra[i], d, s,
                         out + th * d);
        }
        free(s);
    }
    return failed;
}
