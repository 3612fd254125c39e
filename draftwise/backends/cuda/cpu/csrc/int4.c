/* 4-bit weight x bfloat16 activation matmul for the torch backend's 4bit mode on CPU
 * (draftwise/backends/cuda/cpu/int4.py packs the weights, native.py builds and loads this).
 *
 * y[r, n] = sum_k x[r, k] * (d[n, b] * q[n, k] + m[n, b]),  b = k / 32, q in 0..15,
 * computed per block of 32 inputs as  d * (sum_k x q) + m * (sum_k x),  with avx512_bf16
 * dot products (vdpbf16ps: two bf16 products per lane per instruction, summed in float32).
 * A code q enters the dot product as the bfloat16 number 128 + q (its bits are
 * 0x4300 | q: no conversion), so the block sum is sum x (128 + q) - 128 sum x; both
 * 128 sum x and the subtraction are exact to float32's rounding of the sum.
 *
 * One weight tile is 16 outputs x 32 inputs, 320 bytes: 256 bytes of codes, then 16
 * float16 scales d, then 16 float16 mins m. Byte w (0..31) of the codes' 32-byte group u
 * (0..7) holds, for output i = w / 2 and input e = w % 2, the code of input 4u + e in its
 * low nibble and of input 4u + 2 + e in its high nibble: zero-extended to 16-bit words,
 * the low nibbles are exactly the 32 bf16 operands of one vdpbf16ps against the broadcast
 * input pair (x[4u], x[4u+1]), the high nibbles those against (x[4u+2], x[4u+3]).
 *
 * Row invariance: every output element is computed start to end by one thread with the
 * same instruction sequence whatever the number of rows, their chunking, or the thread
 * count (threads split the output tiles), so a row's bits never depend on the other rows.
 * Memory: each thread streams its tiles once per chunk of ROWS (16) rows, prefetching
 * ahead (PF_BLOCKS); the 16 rows of a chunk are measured at ~1.9 dot products per cycle
 * per core, near this CPU's peak.
 */
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>

#define TILE_BYTES 320
#define ROWS 16
/* Software prefetch distance in 320-byte blocks. Measured on the AMD EPYC Zen 5 VM (2
 * threads, the default model's 66 MB of 4-bit matmuls in sequence, as a forward streams
 * them): 2.03 / 2.18 / 2.43 / 2.70 / 4.28 ms at 1 / 2 / 3 / 4 / 8 rows without it,
 * 1.85 / 2.01 / 2.29 / 2.57 / 3.74 ms at 12 (4: about half that gain; 24 and 48: none at
 * one row); the whole verify step 2.70-2.85 -> 2.58-2.66 ms at one row, 6.12 -> 5.55-5.69 at
 * eight. */
#define PF_BLOCKS 12

int dw_int4_ok(void) { return 1; }

static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile, int nblk, const uint16_t *x, int64_t k, const float *xs, int rb,
    uint16_t *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi16(0x000F);
    const __m512i magic = _mm512_set1_epi16(0x4300);
    __m512 tot[ROWS];
    for (int r = 0; r < ROWS; r++) tot[r] = _mm512_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *c = tile + (int64_t)b * TILE_BYTES;
        /* the weights stream from memory once a step: ask for the block PF_BLOCKS ahead
         * (past a tile's end, the thread's next tile; past the matrix, harmless) */
        const char *pf = (const char *)(c + PF_BLOCKS * TILE_BYTES);
        for (int l = 0; l < TILE_BYTES; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
        for (int u = 0; u < 8; u++) {
            __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(c + 32 * u)));
            __m512i lo = _mm512_ternarylogic_epi32(w, low, magic, 0xEA); /* (w & 15) | magic */
            __m512i hi = _mm512_or_si512(_mm512_srli_epi16(w, 4), magic);
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                const uint16_t *xr = x + r * k + 32 * (int64_t)b + 4 * u;
                __m512i xa = _mm512_set1_epi32(*(const int32_t *)xr);
                __m512i xb = _mm512_set1_epi32(*(const int32_t *)(xr + 2));
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)lo, (__m512bh)xa);
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)hi, (__m512bh)xb);
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 256)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 288)));
        for (int r = 0; r < ROWS; r++) {
            if (r >= rb) break;
            __m512 s = _mm512_set1_ps(xs[r * nblk + b]);
            __m512 a = _mm512_sub_ps(acc[r], _mm512_mul_ps(s, _mm512_set1_ps(128.0f)));
            tot[r] = _mm512_fmadd_ps(a, d, tot[r]);
            tot[r] = _mm512_fmadd_ps(s, m, tot[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        _mm256_storeu_si256((__m256i *)(y + r * ldy), (__m256i)_mm512_cvtneps_pbh(tot[r]));
    }
}

/* Row counts as compile-time constants, so the accumulators stay in registers. */
#define CASE(n) case n: tile_rows(tile, nblk, x, k, xs, n, y, ldy); break;
static void tile_any(const uint8_t *tile, int nblk, const uint16_t *x, int64_t k,
                     const float *xs, int rb, uint16_t *y, int64_t ldy) {
    switch (rb) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16) }
}

/* x (T, K) bfloat16, packed (N / 16, K / 32, 320) bytes, y (T, N) bfloat16. Returns 0, or
 * 1 when the block sums could not be allocated. */
int dw_int4_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
               uint16_t *y, int threads) {
    int nblk = (int)(k / 32);
    int64_t tiles = n / 16;
    float *xs = (float *)malloc(sizeof(float) * (size_t)(t * nblk + 1));
    if (xs == NULL) return 1;
    /* sum of each row's block of 32 inputs, in a fixed order */
    for (int64_t r = 0; r < t; r++)
        for (int b = 0; b < nblk; b++) {
            float s = 0.0f;
            for (int e = 0; e < 32; e++) {
                union { uint32_t u; float f; } v;
                v.u = (uint32_t)x[r * k + 32 * b + e] << 16;
                s += v.f;
            }
            xs[r * nblk + b] = s;
        }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tiles > 1)
    for (int64_t j = 0; j < tiles; j++) {
        const uint8_t *tile = packed + j * (int64_t)nblk * TILE_BYTES;
        for (int64_t r0 = 0; r0 < t; r0 += ROWS) {
            int rb = (int)(t - r0 < ROWS ? t - r0 : ROWS);
            tile_any(tile, nblk, x + r0 * k, k, xs + r0 * nblk, rb, y + r0 * n + 16 * j, n);
        }
    }
    free(xs);
    return 0;
}

/* Q8_0 weights (an output head): y[r, n] = sum_b d[n, b] * sum_k x[r, k] q[n, k], q int8.
 * A tile is 16 outputs x 32 inputs, 544 bytes: 16 groups of 32 int8 codes (group p: for
 * output i = w / 2, input 2p + w % 2), then 16 float16 scales. int8 codes are exact in
 * bfloat16 (8 significant bits); they are converted through float32. */
#define Q8_TILE_BYTES 544

static inline __attribute__((always_inline)) void q8_tile_rows(
    const uint8_t *tile, int nblk, const uint16_t *x, int64_t k, int rb, uint16_t *y,
    int64_t ldy) {
    __m512 tot[ROWS];
    for (int r = 0; r < ROWS; r++) tot[r] = _mm512_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *c = tile + (int64_t)b * Q8_TILE_BYTES;
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
        for (int p = 0; p < 16; p++) {
            __m128i c0 = _mm_loadu_si128((const __m128i *)(c + 32 * p));
            __m128i c1 = _mm_loadu_si128((const __m128i *)(c + 32 * p + 16));
            __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c0));
            __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c1));
            __m512bh w = _mm512_cvtne2ps_pbh(f1, f0); /* words 0..15 from f0 */
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                __m512i xp = _mm512_set1_epi32(*(const int32_t *)(x + r * k + 32 * (int64_t)b + 2 * p));
                acc[r] = _mm512_dpbf16_ps(acc[r], w, (__m512bh)xp);
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 512)));
        for (int r = 0; r < ROWS; r++) {
            if (r >= rb) break;
            tot[r] = _mm512_fmadd_ps(acc[r], d, tot[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        _mm256_storeu_si256((__m256i *)(y + r * ldy), (__m256i)_mm512_cvtneps_pbh(tot[r]));
    }
}

#define QCASE(n) case n: q8_tile_rows(tile, nblk, x, k, n, y, ldy); break;
static void q8_tile_any(const uint8_t *tile, int nblk, const uint16_t *x, int64_t k, int rb,
                        uint16_t *y, int64_t ldy) {
    switch (rb) { QCASE(1) QCASE(2) QCASE(3) QCASE(4) QCASE(5) QCASE(6) QCASE(7) QCASE(8) QCASE(9) QCASE(10) QCASE(11) QCASE(12) QCASE(13) QCASE(14) QCASE(15) QCASE(16) }
}

/* x (T, K) bfloat16, packed (N / 16, K / 32, 544) bytes, y (T, N) bfloat16. */
int dw_q8_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
             uint16_t *y, int threads) {
    int nblk = (int)(k / 32);
    int64_t tiles = n / 16;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tiles > 1)
    for (int64_t j = 0; j < tiles; j++) {
        const uint8_t *tile = packed + j * (int64_t)nblk * Q8_TILE_BYTES;
        for (int64_t r0 = 0; r0 < t; r0 += ROWS) {
            int rb = (int)(t - r0 < ROWS ? t - r0 : ROWS);
            q8_tile_any(tile, nblk, x + r0 * k, k, rb, y + r0 * n + 16 * j, n);
        }
    }
    return 0;
}

#else

int dw_int4_ok(void) { return 0; }

int dw_q8_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
             uint16_t *y, int threads) {
    (void)x; (void)t; (void)k; (void)packed; (void)n; (void)y; (void)threads;
    return 2;
}

int dw_int4_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
               uint16_t *y, int threads) {
    (void)x; (void)t; (void)k; (void)packed; (void)n; (void)y; (void)threads;
    return 2;
}

#endif
