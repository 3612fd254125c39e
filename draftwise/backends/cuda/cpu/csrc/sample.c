/* Sampling at temperature > 0 on CPU, read in place from the verify's logits: each row's
 * token is what core.sampling.next_token gives for the same uniform (the repetition
 * penalty, the temperature, a softmax in float64, the CDF inverted at u), without numpy's
 * float64 copies of the 49,152 logits (~0.25 ms a row; here a few tens of microseconds).
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
#include <immintrin.h>

int dw_sample_ok(void) { return 1; }

/* exp(z) for float64 lanes, z <= 0: 2^n e^r with |r| <= ln2 / 2 and a degree-13
 * Taylor polynomial (truncation below 1e-17 relative); z below -700 gives 0 */
static inline __m512d exp_pd(__m512d z) {
    const __m512d lo = _mm512_set1_pd(-700.0);
    __mmask8 tiny = _mm512_cmp_pd_mask(z, lo, _CMP_LT_OQ);
    z = _mm512_max_pd(z, lo);
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(z, _mm512_set1_pd(1.4426950408889634)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), z);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
    static const double c[14] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
                                 1.0 / 3628800.0,    1.0 / 362880.0,    1.0 / 40320.0,
                                 1.0 / 5040.0,       1.0 / 720.0,       1.0 / 120.0,
                                 1.0 / 24.0,         1.0 / 6.0,         0.5,
                                 1.0,                1.0};
    __m512d p = _mm512_set1_pd(c[0]);
    for (int i = 1; i < 14; i++) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c[i]));
    return _mm512_maskz_mov_pd((__mmask8)~tiny, _mm512_scalef_pd(p, n));
}

/* 8 float32 values from x at i (masked past n: -inf, whose exp is 0) */
static inline __m256 load8(const float *x, int64_t i, int64_t n) {
    if (i + 8 <= n) return _mm256_loadu_ps(x + i);
    if (i >= n) return _mm256_set1_ps(-__builtin_inff());
    __mmask8 m = (__mmask8)((1u << (n - i)) - 1u);
    return _mm256_mask_loadu_ps(_mm256_set1_ps(-__builtin_inff()), m, x + i);
}

static int64_t sample_row(const void *logits, int bf16, int64_t v, double t, float penalty,
                          const int64_t *recent, int64_t w, double u, float *x, double *blocks) {
    /* the row as float32 (as numpy's penalty reads it) */
    if (bf16) {
        const uint16_t *b = (const uint16_t *)logits;
        int64_t i = 0;
        for (; i + 16 <= v; i += 16) {
            __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + i)));
            _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
        }
        for (; i < v; i++) {
            uint32_t bits = (uint32_t)b[i] << 16;
            memcpy(x + i, &bits, sizeof bits);
        }
    } else {
        memcpy(x, logits, (size_t)v * sizeof(float));
    }
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
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    int64_t i = 0;
    for (; i + 16 <= v; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
    float top = _mm512_reduce_max_ps(mx);
    for (; i < v; i++) top = x[i] > top ? x[i] : top;
    /* x / t as x * (1 / t): a division per value cost more than the rest together; the
     * two differ by an ulp at most (a token's CDF step moves by about 1e-16) */
    const double inv = 1.0 / t, mt = (double)top * inv;
    const __m512d tv = _mm512_set1_pd(inv);
    const __m512d m = _mm512_set1_pd(mt);
    /* block sums of e^(x / t - m), 16 values a block, and their running total */
    int64_t nb = (v + 15) / 16;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t at = 16 * b;
        __m512d lo = exp_pd(_mm512_fmsub_pd(_mm512_cvtps_pd(load8(x, at, v)), tv, m));
        __m512d hi = exp_pd(_mm512_fmsub_pd(_mm512_cvtps_pd(load8(x, at + 8, v)), tv, m));
        double s = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
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
                __m512d e = exp_pd(_mm512_fmsub_pd(_mm512_set1_pd((double)x[k]), tv, m));
                cum += _mm512_cvtsd_f64(e);
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
