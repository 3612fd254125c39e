/* The 4bit mode's whole decoder forward for a verify (or a plain step) in one call: every
 * layer's norms, fused q/k/v, RoPE, cache write, attention, output projection, SwiGLU MLP
 * and residual adds, then the final norm. draftwise/backends/cuda/cpu/fused.py calls it.
 *
 * It replaces some 80 torch ops per layer (each a few microseconds of dispatch on this
 * project's 2-core CPU, more than the one-row matmuls themselves) with plain loops around
 * the compiled matmul (int4.c) and attention (attention.c). Each row is computed the same
 * way whatever the other rows are: per-row loops in a fixed order, row-invariant matmuls
 * and attention, so the batch-invariant mode's guarantee holds (a row's bits never depend
 * on how many rows are verified together, nor on the thread count).
 *
 * Arithmetic: the residual stream is float32; matmul inputs are rounded to bfloat16 (round
 * to nearest even, as torch); RMSNorm, RoPE, SiLU in float32; the K/V cache is float32, or
 * bfloat16 with kv_bf16 (the 4bit mode's: a rotated key rounded to nearest even, a value
 * stored as the bfloat16 the projection gave).
 * Compiled as ISO C (no contraction into fused multiply-adds), every step is one IEEE
 * operation that fused_eager.py replays with a torch op: keep the two in step.
 *
 * Shapes: x_in (T, C) bf16 embeddings; cos, sin (T, D) float32 at each row's position;
 * per layer l: wqkv[l], wo[l], w13[l], w2[l] packed 4-bit weights (int4.c's layout),
 * attn_norm[l], mlp_norm[l] (C,) bf16; final_norm (C,) bf16; cache float32 (kv_bf16 = 0)
 * or bfloat16 (1), layer l at cache + l * layer_stride elements, laid out (2, Hkv, Tmax, D). Rows 0 .. n_write-1 write their K/V
 * at slots start + i. Row i attends over slots 0 .. committed-1, then extra[i, :n_extra[i]].
 * Outputs: last_x (T, C) bf16 (the residual after the last layer), xn (T, C) bf16 (its
 * final norm: what the output head reads).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

int dw_int4_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
               uint16_t *y, int threads);
int dw_attention_kv(const float *q, const void *cache, int kv_bf16, int64_t tmax, int h,
                    int hkv, int d, int64_t committed, const int64_t *extra,
                    const int32_t *n_extra, int t, int e, float *out, int threads);

static inline float from_bf16(uint16_t v) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)v << 16;
    return c.f;
}

static inline uint16_t to_bf16(float f) { /* round to nearest even, as torch */
    union { uint32_t u; float f; } c;
    c.f = f;
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40u); /* NaN */
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

/* for (int i = 0; i < t; i++) { body }, the rows split between ``par`` threads where par
 * > 1 (a prompt's chunk: see split_rows), else a plain loop with no OpenMP call at all. A
 * row's operations are the same either way. The variable holding the count must be named
 * par (the pragma names it). */
#define FOR_ROWS(i, t, par, ...)                                                  \
    do {                                                                          \
        if ((par) > 1) {                                                          \
            _Pragma("omp parallel for schedule(static) num_threads(par)")         \
            for (int i = 0; i < (t); i++) __VA_ARGS__                             \
        } else {                                                                  \
            for (int i = 0; i < (t); i++) __VA_ARGS__                             \
        }                                                                         \
    } while (0)

/* out = bf16(w * bf16(x / rms(x))) per row, as transformers' LlamaRMSNorm in bf16. The
 * sum of squares: lane l (0..15) adds x[j]^2 for j = l, l + 16, ... in order, then the
 * lanes combine pairwise (8, 4, 2, 1): an order torch can replay op for op (fused_eager.py);
 * c is a multiple of 16. */
static void rms_norm(const float *x, const uint16_t *w, int t, int c, float eps,
                     uint16_t *out, int par) {
    FOR_ROWS(i, t, par, {
        const float *xr = x + (int64_t)i * c;
        float acc[16] = {0};
        for (int j = 0; j < c; j += 16)
            for (int l = 0; l < 16; l++) acc[l] += xr[j + l] * xr[j + l];
        for (int w2 = 8; w2 > 0; w2 /= 2)
            for (int l = 0; l < w2; l++) acc[l] += acc[l + w2];
        float ss = acc[0];
        float r = 1.0f / sqrtf(ss / (float)c + eps);
        for (int j = 0; j < c; j++)
            out[(int64_t)i * c + j] = to_bf16(from_bf16(w[j]) * from_bf16(to_bf16(xr[j] * r)));
    });
}

/* rotate_half RoPE of one head vector (D), float32. */
static inline void rope(const uint16_t *x, const float *cs, const float *sn, int d, float *out) {
    int half = d / 2;
    for (int j = 0; j < d; j++) {
        float rot = j < half ? -from_bf16(x[j + half]) : from_bf16(x[j - half]);
        out[j] = from_bf16(x[j]) * cs[j] + rot * sn[j];
    }
}

/* out = bf16(silu(gate) * up) for one row: gate = gu[0 .. f-1], up = gu[f .. 2f-1]. */
static void swiglu(const uint16_t *gu, int f, uint16_t *out) {
    int j = 0;
#if defined(__AVX512F__)
    /* silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (never overflows) */
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= f; j += 16) {
        __m512 g = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gu + j))), 16));
        __m512 u = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gu + f + j))), 16));
        __m512 ag = _mm512_abs_ps(g);
        __m512 e = dw_exp16(_mm512_sub_ps(_mm512_setzero_ps(), ag));
        __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
        __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
        __m512 sig = _mm512_mask_mul_ps(inv, neg, inv, e); /* g < 0: e / (1 + e) */
        __m512 y = _mm512_mul_ps(_mm512_mul_ps(g, sig), u);
        _mm256_storeu_si256((__m256i *)(out + j), dw_to_bf16_16(y));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    /* the same arithmetic on 8 lanes */
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; j + 8 <= f; j += 8) {
        __m256 g = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(gu + j))), 16));
        __m256 u = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(gu + f + j))), 16));
        __m256 ag = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
        __m256 e = dw_exp8(_mm256_sub_ps(_mm256_setzero_ps(), ag));
        __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
        __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
        __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(inv, e), neg); /* g < 0: e / (1 + e) */
        __m256 y = _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
        _mm_storeu_si128((__m128i *)(out + j), dw_to_bf16_8(y));
    }
#endif
    for (; j < f; j++) { /* the tail, and CPUs without AVX2 */
        float g = from_bf16(gu[j]), u = from_bf16(gu[f + j]);
        float e = expf(-fabsf(g)), inv = 1.0f / (1.0f + e);
        float sig = g < 0.0f ? inv * e : inv;
        out[j] = to_bf16(g * sig * u);
    }
}

/* Rows from which the per-row work between the matmuls (norms, RoPE and the cache
 * writes, SiLU, the residual adds) is split between the threads as well: a prompt's
 * chunk. Each row's operations are the same either way (the tests compare both); for a
 * verify's few rows a parallel region costs about what it saves. dw_forward_split_rows
 * sets it (0: never). */
static int split_rows = 16;

int dw_forward_split_rows(int rows) {
    if (rows >= 0) split_rows = rows;
    return split_rows;
}

int dw_forward(int n_layers, int c, int h, int hkv, int d, int f, float eps,
               const uint16_t *x_in, int t, const float *cos, const float *sin,
               const uint8_t *const *wqkv, const uint8_t *const *wo,
               const uint8_t *const *w13, const uint8_t *const *w2,
               const uint16_t *const *attn_norm, const uint16_t *const *mlp_norm,
               const uint16_t *final_norm, void *cache, int kv_bf16, int64_t layer_stride, int64_t tmax,
               int64_t start, int n_write, int64_t committed, const int64_t *extra,
               const int32_t *n_extra, int e, uint16_t *last_x, uint16_t *xn, int threads) {
    int nqkv = (h + 2 * hkv) * d;
    float *x = (float *)malloc(sizeof(float) * (size_t)t * c);
    uint16_t *hn = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)t * (c > h * d ? c : h * d));
    uint16_t *big = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)t * (nqkv > 2 * f ? nqkv : 2 * f));
    uint16_t *act = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)t * (f > c ? f : c));
    float *q = (float *)malloc(sizeof(float) * (size_t)t * h * d);
    float *o = (float *)malloc(sizeof(float) * (size_t)t * h * d);
    const size_t elem = kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    int failed = x == NULL || hn == NULL || big == NULL || act == NULL || q == NULL || o == NULL
                 || d > 512;
    /* threads for the per-row work: 1 below split_rows rows */
    const int par = split_rows > 0 && t >= split_rows && threads > 1 ? threads : 1;
    if (!failed) {
        for (int64_t i = 0; i < (int64_t)t * c; i++) x[i] = from_bf16(x_in[i]);
        float scale = 1.0f / sqrtf((float)d);
        for (int l = 0; l < n_layers && !failed; l++) {
            char *kv = (char *)cache + (size_t)l * layer_stride * elem;
            rms_norm(x, attn_norm[l], t, c, eps, hn, par);
            failed |= dw_int4_mm(hn, t, c, wqkv[l], nqkv, big, threads);
            FOR_ROWS(i, t, par, {
                float kr[512]; /* a rotated key before it is rounded into a bfloat16 cache */
                const uint16_t *row = big + (int64_t)i * nqkv;
                const float *cs = cos + (int64_t)i * d, *sn = sin + (int64_t)i * d;
                for (int hh = 0; hh < h; hh++) {
                    float *qh = q + ((int64_t)i * h + hh) * d;
                    rope(row + hh * d, cs, sn, d, qh);
                    for (int j = 0; j < d; j++) qh[j] *= scale;
                }
                if (i >= n_write) continue;
                for (int g = 0; g < hkv; g++) {
                    size_t ks = (size_t)((int64_t)g * tmax + start + i) * d;
                    size_t vs = (size_t)((int64_t)(hkv + g) * tmax + start + i) * d;
                    const uint16_t *vrow = row + (h + hkv + g) * d;
                    if (kv_bf16) {
                        uint16_t *kslot = (uint16_t *)kv + ks, *vslot = (uint16_t *)kv + vs;
                        rope(row + (h + g) * d, cs, sn, d, kr);
                        for (int j = 0; j < d; j++) kslot[j] = to_bf16(kr[j]);
                        memcpy(vslot, vrow, sizeof(uint16_t) * (size_t)d);
                    } else {
                        float *kslot = (float *)kv + ks, *vslot = (float *)kv + vs;
                        rope(row + (h + g) * d, cs, sn, d, kslot);
                        for (int j = 0; j < d; j++) vslot[j] = from_bf16(vrow[j]);
                    }
                }
            });
            failed |= dw_attention_kv(q, kv, kv_bf16, tmax, h, hkv, d, committed, extra, n_extra,
                                      t, e, o, threads);
            const int64_t hd = (int64_t)h * d;
            FOR_ROWS(i, t, par, {
                for (int64_t j = i * hd; j < (i + 1) * hd; j++) hn[j] = to_bf16(o[j]);
            });
            failed |= dw_int4_mm(hn, t, hd, wo[l], c, act, threads);
            FOR_ROWS(i, t, par, {
                for (int64_t j = (int64_t)i * c; j < (int64_t)(i + 1) * c; j++) x[j] += from_bf16(act[j]);
            });
            rms_norm(x, mlp_norm[l], t, c, eps, hn, par);
            failed |= dw_int4_mm(hn, t, c, w13[l], 2 * f, big, threads);
            FOR_ROWS(i, t, par, { swiglu(big + (int64_t)i * 2 * f, f, act + (int64_t)i * f); });
            failed |= dw_int4_mm(act, t, f, w2[l], c, hn, threads);
            FOR_ROWS(i, t, par, {
                for (int64_t j = (int64_t)i * c; j < (int64_t)(i + 1) * c; j++) x[j] += from_bf16(hn[j]);
            });
        }
        if (!failed) {
            for (int64_t i = 0; i < (int64_t)t * c; i++) last_x[i] = to_bf16(x[i]);
            rms_norm(x, final_norm, t, c, eps, xn, par);
        }
    }
    free(x); free(hn); free(big); free(act); free(q); free(o);
    return failed;
}
