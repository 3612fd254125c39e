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
        float *s = (float *)malloc(sizeof(float) * (size_t)(committed + most + 1));
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
            one_row_head(q + th * d, K, V, committed, extra + (int64_t)i * e, n_extra[i], d, s,
                         out + th * d);
        }
        free(s);
    }
    return failed;
}
