/* Sampling at temperature > 0 on CPU, read in place from the verify's logits: each row's
 * token is what core.sampling.next_token gives for the same uniform (the repetition
 * penalty, the temperature, a softmax in float64, the CDF inverted at u), without numpy's
 * float64 copies of the 49,152 logits (~0.25 ms a row; here a few tens of microseconds;
 * on an AMD EPYC Zen 3 with the AVX2 path 0.12 ms against numpy's 0.63).
 * backend.py calls it through native.py's native_sample when a generation samples with
 * temperature and penalty only (no top-k, top-p or min-p: those take the numpy path).
 *
 * The sums run in blocks of 16 (numpy: one running sum), so a u within about 1e-15 of
 * the boundary between two tokens' CDF steps may pick the neighbour: the distribution
 * is the same, and plain and speculative decoding both sample here, so the same seed
 * gives them the same text.
 *
 * Shapes: logits (rows, v) row-major, bfloat16 bits (bf16 = 1) or float32; recent
 * (rows, w) int64 token ids of each row's penalty window; u (rows,) float64 in [0, 1);
 * out (rows,) int64; scratch: v floats and v / 16 + 1 doubles, the caller's.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define DW_SAMPLE 512
#elif defined(__AVX2__) && defined(__FMA__)
#define DW_SAMPLE 256
#endif

#ifdef DW_SAMPLE
#include <immintrin.h>

int dw_sample_ok(void) { return 1; }

/* exp(z) for z <= 0: 2^n e^r with |r| <= ln2 / 2 and a degree-13 Taylor polynomial
 * (truncation below 1e-17 relative); z below -700 gives 0. */
static const double EXP_C[14] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
                                 1.0 / 3628800.0,    1.0 / 362880.0,    1.0 / 40320.0,
                                 1.0 / 5040.0,       1.0 / 720.0,       1.0 / 120.0,
                                 1.0 / 24.0,         1.0 / 6.0,         0.5,
                                 1.0,                1.0};
#endif

#if DW_SAMPLE == 512
/* exp on 8 float64 lanes */
static inline __m512d exp_pd(__m512d z) {
    const __m512d lo = _mm512_set1_pd(-700.0);
    __mmask8 tiny = _mm512_cmp_pd_mask(z, lo, _CMP_LT_OQ);
    z = _mm512_max_pd(z, lo);
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(z, _mm512_set1_pd(1.4426950408889634)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), z);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
    __m512d p = _mm512_set1_pd(EXP_C[0]);
    for (int i = 1; i < 14; i++) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(EXP_C[i]));
    return _mm512_maskz_mov_pd((__mmask8)~tiny, _mm512_scalef_pd(p, n));
}

/* 8 float32 values from x at i (masked past n: -inf, whose exp is 0) */
static inline __m256 load8(const float *x, int64_t i, int64_t n) {
    if (i + 8 <= n) return _mm256_loadu_ps(x + i);
    if (i >= n) return _mm256_set1_ps(-__builtin_inff());
    __mmask8 m = (__mmask8)((1u << (n - i)) - 1u);
    return _mm256_mask_loadu_ps(_mm256_set1_ps(-__builtin_inff()), m, x + i);
}

/* x (v) = the bfloat16 row widened */
static void widen_row(const uint16_t *b, int64_t v, float *x) {
    int64_t i = 0;
    for (; i + 16 <= v; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + i)));
        _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
    }
    for (; i < v; i++) {
        uint32_t bits = (uint32_t)b[i] << 16;
        memcpy(x + i, &bits, sizeof bits);
    }
}

static float row_max(const float *x, int64_t v) {
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    int64_t i = 0;
    for (; i + 16 <= v; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
    float top = _mm512_reduce_max_ps(mx);
    for (; i < v; i++) top = x[i] > top ? x[i] : top;
    return top;
}

/* sum of e^(x / t - m) over the 16 values from at (none past v) */
static inline double block_sum(const float *x, int64_t at, int64_t v, double inv, double mt) {
    const __m512d tv = _mm512_set1_pd(inv), m = _mm512_set1_pd(mt);
    __m512d lo = exp_pd(_mm512_fmsub_pd(_mm512_cvtps_pd(load8(x, at, v)), tv, m));
    __m512d hi = exp_pd(_mm512_fmsub_pd(_mm512_cvtps_pd(load8(x, at + 8, v)), tv, m));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

/* e^(xk / t - m), as block_sum computes each term */
static inline double term(float xk, double inv, double mt) {
    __m512d e = exp_pd(_mm512_fmsub_pd(_mm512_set1_pd((double)xk), _mm512_set1_pd(inv), _mm512_set1_pd(mt)));
    return _mm512_cvtsd_f64(e);
}

#elif DW_SAMPLE == 256
/* The same on 4 float64 lanes (AVX2): 2^n built in the exponent field (n is an integer
 * in -1010..0 here, so n + 1023 is read off a float64 with the magic 2^52 + 2^51 added
 * and shifted into place), the multiply exact as scalef's. */
static inline __m256d exp_pd(__m256d z) {
    const __m256d lo = _mm256_set1_pd(-700.0);
    __m256d keep = _mm256_cmp_pd(z, lo, _CMP_NLT_UQ); /* not below -700 (NaN kept, as there) */
    z = _mm256_max_pd(z, lo);
    __m256d n = _mm256_round_pd(_mm256_mul_pd(z, _mm256_set1_pd(1.4426950408889634)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), z);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
    __m256d p = _mm256_set1_pd(EXP_C[0]);
    for (int i = 1; i < 14; i++) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(EXP_C[i]));
    __m256d k = _mm256_add_pd(n, _mm256_set1_pd(1023.0 + 6755399441055744.0));
    __m256d two_n = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_castpd_si256(k), 52));
    return _mm256_and_pd(_mm256_mul_pd(p, two_n), keep);
}

/* 4 float32 values from x at i as float64 (past n: -inf, whose exp is 0) */
static inline __m256d load4d(const float *x, int64_t i, int64_t n) {
    if (i + 4 <= n) return _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    float tmp[4];
    for (int l = 0; l < 4; l++) tmp[l] = i + l < n ? x[i + l] : -__builtin_inff();
    return _mm256_cvtps_pd(_mm_loadu_ps(tmp));
}

static void widen_row(const uint16_t *b, int64_t v, float *x) {
    int64_t i = 0;
    for (; i + 8 <= v; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + i)));
        _mm256_storeu_ps(x + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
    for (; i < v; i++) {
        uint32_t bits = (uint32_t)b[i] << 16;
        memcpy(x + i, &bits, sizeof bits);
    }
}

static float row_max(const float *x, int64_t v) {
    __m256 mx = _mm256_set1_ps(-__builtin_inff());
    int64_t i = 0;
    for (; i + 8 <= v; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
    float lanes[8], top = -__builtin_inff();
    _mm256_storeu_ps(lanes, mx);
    for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
    for (; i < v; i++) top = x[i] > top ? x[i] : top;
    return top;
}

static inline double block_sum(const float *x, int64_t at, int64_t v, double inv, double mt) {
    const __m256d tv = _mm256_set1_pd(inv), m = _mm256_set1_pd(mt);
    __m256d a = _mm256_setzero_pd();
    for (int q = 0; q < 4; q++)
        a = _mm256_add_pd(a, exp_pd(_mm256_fmsub_pd(load4d(x, at + 4 * q, v), tv, m)));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

static inline double term(float xk, double inv, double mt) {
    __m256d e = exp_pd(_mm256_fmsub_pd(_mm256_set1_pd((double)xk), _mm256_set1_pd(inv), _mm256_set1_pd(mt)));
    return _mm256_cvtsd_f64(e);
}
#endif

#ifdef DW_SAMPLE
static int64_t sample_row(const void *logits, int bf16, int64_t v, double t, float penalty,
                          const int64_t *recent, int64_t w, double u, float *x, double *blocks) {
    /* the row as float32 (as numpy's penalty reads it) */
    if (bf16)
        widen_row((const uint16_t *)logits, v, x);
    else
        memcpy(x, logits, (size_t)v * sizeof(float));
    if (penalty != 1.0f) {
        for (int64_t j = 0; j < w; j++) {
            int64_t id = recent[j];
            int dup = 0;
            for (int64_t i = 0; i < j && !dup; i++) dup = recent[i] == id;
            if (dup) continue; /* a token repeated in the window is penalised once */
            float val = x[id];
            x[id] = val > 0 ? val / penalty : val * penalty;
        }
    }
    /* the maximum (of float32 values: x / t keeps their order) */
    float top = row_max(x, v);
    /* x / t as x * (1 / t): a division per value cost more than the rest together; the
     * two differ by an ulp at most (a token's CDF step moves by about 1e-16) */
    const double inv = 1.0 / t, mt = (double)top * inv;
    /* block sums of e^(x / t - m), 16 values a block, and their running total */
    int64_t nb = (v + 15) / 16;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        double s = block_sum(x, 16 * b, v, inv, mt);
        blocks[b] = s;
        total += s;
    }
    double target = u * total;
    /* the first index whose running sum passes the target (numpy: searchsorted right) */
    double cum = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        if (cum + blocks[b] > target) {
            int64_t end = 16 * b + 16 < v ? 16 * b + 16 : v;
            for (int64_t k = 16 * b; k < end; k++) {
                cum += term(x[k], inv, mt);
                if (cum > target) return k;
            }
            break; /* rounding: the block's own sum said more than its values add to */
        }
        cum += blocks[b];
    }
    /* u within rounding of 1: the last token with a probability */
    for (int64_t k = v - 1; k > 0; k--)
        if (__builtin_fma((double)x[k], inv, -mt) > -700.0) return k;
    return 0;
}

/* out[r] = the token of row r at u[r]. Returns 0; 1 for sizes it does not take or a
 * temperature that is not positive; 2 for a penalty-window id outside 0..v-1. */
int dw_sample_rows(const void *logits, int bf16, int64_t rows, int64_t v, double t,
                   float penalty, const int64_t *recent, int64_t w, const double *u,
                   int64_t *out, float *x, double *blocks) {
    if (v < 1 || v >= ((int64_t)1 << 31) || rows < 0 || w < 0 || !(t > 0.0)) return 1;
    for (int64_t k = 0; k < rows * w; k++)
        if (recent[k] < 0 || recent[k] >= v) return 2;
    size_t width = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r = 0; r < rows; r++)
        out[r] = sample_row((const char *)logits + (size_t)r * width, bf16, v, t, penalty,
                            recent + r * w, w, u[r], x, blocks);
    return 0;
}

#else

int dw_sample_ok(void) { return 0; }

int dw_sample_rows(const void *logits, int bf16, int64_t rows, int64_t v, double t,
                   float penalty, const int64_t *recent, int64_t w, const double *u,
                   int64_t *out, float *x, double *blocks) {
    (void)logits; (void)bf16; (void)rows; (void)v; (void)t; (void)penalty; (void)recent;
    (void)w; (void)u; (void)out; (void)x; (void)blocks;
    return 1;
}

#endif
