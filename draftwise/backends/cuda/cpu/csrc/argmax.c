/* The verify's greedy answer: the argmax of each row of logits, bfloat16 or float32, as
 * torch.argmax gives it (the first index of the maximum; a row holding a NaN answers its
 * first NaN), without a float32 copy of the logits. backend.py calls it through
 * native.py's native_argmax for the greedy path on CPU: 0.13 ms of a one-row step went
 * to torch's copy and argmax over the 49,152 logits, a few microseconds here.
 *
 * Shapes: x (rows, n) row-major, bfloat16 bits (bf16 = 1) or float32; out (rows,) int64.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

int dw_argmax_ok(void) {
#if defined(__AVX512F__) || defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

static inline float at(const void *x, int bf16, int64_t i) {
    if (!bf16) return ((const float *)x)[i];
    uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The scalar rule from element `from` on, given the best so far (value, index). */
static int64_t scan(const void *x, int bf16, int64_t from, int64_t n, float best, int64_t idx) {
    for (int64_t i = from; i < n; i++) {
        float v = at(x, bf16, i);
        if (v != v) return i; /* NaN */
        if (v > best) {
            best = v;
            idx = i;
        }
    }
    return idx;
}

static int64_t row_argmax(const void *x, int bf16, int64_t n) {
    if (n <= 0) return 0;
#if defined(__AVX512F__)
    if (n >= 16) {
        __m512 best = _mm512_set1_ps(-__builtin_inff());
        __m512i bidx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i idx = bidx;
        const __m512i step = _mm512_set1_epi32(16);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m512 v = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                  _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i))), 16))
                            : _mm512_loadu_ps((const float *)x + i);
            __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            if (nan) return i + __builtin_ctz((unsigned)nan);
            __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
            best = _mm512_mask_mov_ps(best, gt, v);
            bidx = _mm512_mask_mov_epi32(bidx, gt, idx);
            idx = _mm512_add_epi32(idx, step);
        }
        /* lanes hold each one's first maximum: the largest value, then the lowest index */
        float m = _mm512_reduce_max_ps(best);
        __mmask16 top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(m), _CMP_EQ_OQ);
        __m512i big = _mm512_set1_epi32(INT32_MAX);
        int64_t first = _mm512_reduce_min_epi32(_mm512_mask_mov_epi32(big, top, bidx));
        return scan(x, bf16, i, n, m, first);
    }
#elif defined(__AVX2__)
    if (n >= 8) { /* the same on 8 lanes */
        __m256 best = _mm256_set1_ps(-__builtin_inff());
        __m256i bidx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i idx = bidx;
        const __m256i step = _mm256_set1_epi32(8);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
                                  _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i))), 16))
                            : _mm256_loadu_ps((const float *)x + i);
            int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            if (nan) return i + __builtin_ctz((unsigned)nan);
            __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
            best = _mm256_blendv_ps(best, v, gt);
            bidx = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bidx), _mm256_castsi256_ps(idx), gt));
            idx = _mm256_add_epi32(idx, step);
        }
        float bv[8];
        int32_t bi[8];
        _mm256_storeu_ps(bv, best);
        _mm256_storeu_si256((__m256i *)bi, bidx);
        float m = bv[0];
        for (int l = 1; l < 8; l++) m = bv[l] > m ? bv[l] : m;
        int64_t first = INT32_MAX;
        for (int l = 0; l < 8; l++)
            if (bv[l] == m && bi[l] < first) first = bi[l];
        return scan(x, bf16, i, n, m, first);
    }
#endif
    float first = at(x, bf16, 0);
    return first != first ? 0 : scan(x, bf16, 1, n, first, 0);
}

/* out[r] = argmax of row r. Returns 0, or 1 for sizes it does not take (n >= 2^31). */
int dw_argmax(const void *x, int bf16, int64_t rows, int64_t n, int64_t *out) {
    if (n >= ((int64_t)1 << 31) || rows < 0) return 1;
    size_t width = (size_t)n * (bf16 ? 2 : 4);
    for (int64_t r = 0; r < rows; r++)
        out[r] = row_argmax((const char *)x + (size_t)r * width, bf16, n);
    return 0;
}
