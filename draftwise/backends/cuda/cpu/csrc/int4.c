/* 4-bit weight x int8-quantised activation matmul for the torch backend's 4bit mode on CPU
 * (draftwise/backends/cuda/cpu/int4.py packs the weights, native.py builds and loads this).
 *
 * The activations are quantised per row and block of 32 inputs, as llama.cpp's Q8_1 does
 * for a Q4_1 weight: d_x = max |x| / 127, q_x = round_half_even(x * (127 / max |x|)) in
 * -127..127 (0 for an all-zero block), s_x = d_x * sum q_x. Then
 *
 *   y[r, n] = sum_b  (d[n, b] * d_x[r, b]) * (sum_k q_x q) + m[n, b] * s_x[r, b],
 *
 * q in 0..15 the weight codes, d their float16 scale and m = zero - 8 d their float16 min.
 * The inner sums are exact int32 dot products (vpdpbusd: four u8 x s8 products per lane
 * per instruction, avx512_vnni), so a 16-output tile costs 8 instructions per row and
 * block, half the bfloat16 dot products this kernel used before (measured on the AMD EPYC
 * Zen 5 VM, the default model's 120 matmuls in sequence, 2 threads: 1.22 / 1.41 / 1.96 /
 * 3.79 ms at 1 / 4 / 8 / 16 rows against 1.30 / 2.01 / 3.23 / 5.39).
 *
 * One weight tile is 16 outputs x 32 inputs, 320 bytes: 256 bytes of codes, then 16
 * float16 scales d, then 16 float16 mins m. Byte p = 4 i + e (i: output 0..15, e: 0..3) of
 * the codes' 64-byte group g (0..3) holds the code of input 8 g + e in its low nibble and
 * of input 8 g + 4 + e in its high nibble: masked, the low nibbles are the 64 unsigned
 * operands of one vpdpbusd against the broadcast inputs 8 g .. 8 g + 3, the high nibbles
 * those against 8 g + 4 .. 8 g + 7.
 *
 * Row invariance: a row's quantisation reads only that row; every output element is
 * computed start to end by one thread with the same instruction sequence whatever the
 * number of rows, their chunking, or the thread count (threads split the output tiles),
 * so a row's bits never depend on the other rows.
 * Memory: each thread streams its tiles once per chunk of ROWS (8) rows, prefetching
 * ahead (PF_BLOCKS).
 */
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__) && defined(__AVX512VNNI__)
#define DW_INT4 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DW_INT4 256
#endif

#ifdef DW_INT4
#include <immintrin.h>
#define TILE_BYTES 320
#define Q8_TILE_BYTES 576
/* Software prefetch distance in 320-byte blocks. Measured on the AMD EPYC Zen 5 VM with
 * the bfloat16 kernel before this one (2 threads, the default model's 66 MB of 4-bit
 * matmuls in sequence): 2.03 -> 1.85 ms at one row, 4.28 -> 3.74 at eight (4: about half
 * that gain; 24 and 48: none at one row). The hint is non-temporal: the ~96 MB of weights
 * a step streams then pass the caches without evicting the L3's other contents (the
 * K/V cache, a drafter's weights). Measured on that VM, two alternations each, 8 corpus
 * prompts: a ReDrafter proposal 0.22-0.28 ms against 0.34 (its one-token chain call
 * 0.09-0.10 against 0.13), plain decoding 416-442 tok/s against 388-395. */
#define PF_BLOCKS 12
#endif

#if DW_INT4 == 512
/* 8 rows a pass: 8 int32 and 8 float32 accumulators stay in registers (16 rows spilled:
 * 3.69 against 4.36 ms at 16 rows on the Zen 5 VM, equal at 1-8). */
#define ROWS 8
/* the Q8 head's activations enter vpdpbusd as unsigned: q_x + 128 */
#define Q8_BIAS 0x80

/* Each row's blocks of 32 bfloat16 inputs as int8 codes (xq (T, K)), their scales d_x and
 * d_x * sum q_x (dx, sx (T, K / 32)). ``bias`` 0x80 stores q_x + 128 (the unsigned operand
 * of the Q8 head's products), 0 stores q_x. Row r's results read only row r. */
static void quantise_rows(const uint16_t *x, int64_t t, int64_t k, uint8_t bias, int8_t *xq,
                          float *dx, float *sx) {
    int nblk = (int)(k / 32);
    const __m128i flip = _mm_set1_epi8((char)bias);
    for (int64_t r = 0; r < t; r++)
        for (int b = 0; b < nblk; b++) {
            const uint16_t *xp = x + r * k + 32 * b;
            __m512 v0 = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)xp)), 16));
            __m512 v1 = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(xp + 16))), 16));
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            float d = amax / 127.0f;
            __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            /* round half to even (the default MXCSR mode); |q| <= 127 up to rounding, and
             * the conversion to int8 saturates */
            __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m128i b0 = _mm512_cvtsepi32_epi8(q0), b1 = _mm512_cvtsepi32_epi8(q1);
            int8_t *out = xq + r * k + 32 * b;
            _mm_storeu_si128((__m128i *)out, _mm_xor_si128(b0, flip));
            _mm_storeu_si128((__m128i *)(out + 16), _mm_xor_si128(b1, flip));
            /* the sum of the stored (saturated) codes */
            int s = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_cvtepi8_epi32(b0), _mm512_cvtepi8_epi32(b1)));
            dx[r * nblk + b] = d;
            sx[r * nblk + b] = d * (float)s;
        }
}

static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile, int nblk, const int8_t *xq, int64_t k, const float *dx,
    const float *sx, int rb, uint16_t *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 tot[ROWS];
    for (int r = 0; r < ROWS; r++) tot[r] = _mm512_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *c = tile + (int64_t)b * TILE_BYTES;
        /* the weights stream from memory once a step: ask for the block PF_BLOCKS ahead
         * (past a tile's end, the thread's next tile; past the matrix, harmless) */
        const char *pf = (const char *)(c + PF_BLOCKS * TILE_BYTES);
        for (int l = 0; l < TILE_BYTES; l += 64) _mm_prefetch(pf + l, _MM_HINT_NTA);
        __m512i acc[ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_si512();
        for (int g = 0; g < 4; g++) {
            __m512i w = _mm512_loadu_si512((const void *)(c + 64 * g));
            __m512i lo = _mm512_and_si512(w, low);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                const int8_t *xr = xq + r * k + 32 * (int64_t)b + 8 * g;
                acc[r] = _mm512_dpbusd_epi32(acc[r], lo, _mm512_set1_epi32(*(const int32_t *)xr));
                acc[r] = _mm512_dpbusd_epi32(acc[r], hi, _mm512_set1_epi32(*(const int32_t *)(xr + 4)));
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 256)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 288)));
        for (int r = 0; r < ROWS; r++) {
            if (r >= rb) break;
            __m512 f = _mm512_cvtepi32_ps(acc[r]); /* exact: |sum| <= 32 * 15 * 127 */
            tot[r] = _mm512_fmadd_ps(f, _mm512_mul_ps(d, _mm512_set1_ps(dx[r * nblk + b])), tot[r]);
            tot[r] = _mm512_fmadd_ps(_mm512_set1_ps(sx[r * nblk + b]), m, tot[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        _mm256_storeu_si256((__m256i *)(y + r * ldy), (__m256i)_mm512_cvtneps_pbh(tot[r]));
    }
}

/* Q8_0 weights (an output head): y[r, n] = sum_b d[n, b] d_x[r, b] sum_k q_x[r, k] q[n, k],
 * q int8, q_x the activations quantised as above. vpdpbusd multiplies unsigned by signed
 * bytes, so the activations enter as q_x + 128 and 128 * sum_k q[n, k] (stored per tile
 * and block) is taken off the exact int32 sum. A tile is 16 outputs x 32 inputs, 576
 * bytes: 8 groups of 64 int8 codes (group p, byte 4 i + e: output i, input 4 p + e), 16
 * float16 scales, then 16 int16 code sums. */

static inline __attribute__((always_inline)) void q8_tile_rows(
    const uint8_t *tile, int nblk, const int8_t *xu, int64_t k, const float *dx, int rb,
    uint16_t *y, int64_t ldy) {
    __m512 tot[ROWS];
    for (int r = 0; r < ROWS; r++) tot[r] = _mm512_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *c = tile + (int64_t)b * Q8_TILE_BYTES;
        const char *pf = (const char *)(c + 8 * Q8_TILE_BYTES);
        for (int l = 0; l < Q8_TILE_BYTES; l += 64) _mm_prefetch(pf + l, _MM_HINT_NTA);
        __m512i acc[ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            __m512i w = _mm512_loadu_si512((const void *)(c + 64 * p));
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                __m512i xp = _mm512_set1_epi32(*(const int32_t *)(xu + r * k + 32 * (int64_t)b + 4 * p));
                acc[r] = _mm512_dpbusd_epi32(acc[r], xp, w);
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 512)));
        __m512i off = _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(c + 544))), 7);
        for (int r = 0; r < ROWS; r++) {
            if (r >= rb) break;
            __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], off)); /* exact: |sum| <= 32 * 128 * 127 */
            tot[r] = _mm512_fmadd_ps(f, _mm512_mul_ps(d, _mm512_set1_ps(dx[r * nblk + b])), tot[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        _mm256_storeu_si256((__m256i *)(y + r * ldy), (__m256i)_mm512_cvtneps_pbh(tot[r]));
    }
}

#elif DW_INT4 == 256
/* The same arithmetic with AVX2, FMA and F16C (every x86-64 CPU since 2013-2015, the AMD
 * EPYC Zen 1-3 among them), bit for bit: the int32 sums are exact, and each output's float
 * operations (d * d_x, two fused multiply-adds per block, the bfloat16 rounding of
 * vcvtneps2bf16) run in the same order on the same values. Without vpdpbusd the products
 * are vpmaddubsw (u8 x s8, adjacent pairs summed into int16) then vpmaddwd by ones:
 * - 4-bit codes (0..15) x activations (-127..127): a pair is at most 2 * 15 * 127, so a
 *   block's 8 products per int16 lane (4 groups, low and high nibbles) sum to at most
 *   30480 and stay in int16 until one vpmaddwd a block;
 * - the Q8 head's int8 codes: |code| (0..128) x sign-moved activations, at most 32512 a
 *   pair, so each vpmaddubsw goes to int32 at once (llama.cpp's AVX2 trick; no + 128).
 * 4 rows a pass: 8 int16 accumulators, the unpacked codes and the broadcasts fill the 16
 * ymm registers. */
#define ROWS 4
#define Q8_BIAS 0 /* the activations stay signed: the sign moves onto them instead */

/* Pin an integer accumulator in a register here (an empty asm that "changes" it). Integer
 * adds are associative, so without it GCC sums a block's products as a tree: it computes
 * all 32 vpmaddubsw of 4 rows first, spills them to the stack, then reloads them to add
 * (a store and a load per product). Pinned, each group's products go into the running
 * sum at once, in registers; the int32 block sums are exact either way, so the bits are
 * the same. Measured on an AMD EPYC Zen 3 (2 threads, the default model's 120 matmuls,
 * cache-resident, random weights, medians of 15): 2.59 / 3.95 / 6.83 / 12.51 / 22.88 ->
 * 2.37 / 3.09 / 4.80 / 8.56 / 15.19 ms at 1 / 2 / 4 / 8 / 16 rows; the Q8 head at 16 rows
 * 10.55 -> 5.27 ms (1-4 rows unchanged: its 28 MB of weights set their time). The
 * AVX-512 path's vpdpbusd accumulates in place and needs no pin. */
#define KEEP2(a, b) __asm__("" : "+x"(a), "+x"(b))

/* Eight floats to bfloat16 bits exactly as vcvtneps2bf16 (the AVX-512 path's rounding):
 * round to nearest even, zero and denormals to a signed zero, NaN made quiet. */
static inline __m256i cvtne_bf16_8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                                   _mm256_and_si256(hi, _mm256_set1_epi32(1))), 16);
    __m256i ex = _mm256_and_si256(u, _mm256_set1_epi32(0x7f800000));
    __m256i tiny = _mm256_cmpeq_epi32(ex, _mm256_setzero_si256()); /* zero or denormal */
    r = _mm256_blendv_epi8(r, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), tiny);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

/* Store 8 bfloat16 results (each in the low half of an int32 lane). */
static inline void store_bf16_8(uint16_t *y, __m256i r) {
    __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)y, p);
}

static inline __m256 bf16_8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static void quantise_rows(const uint16_t *x, int64_t t, int64_t k, uint8_t bias, int8_t *xq,
                          float *dx, float *sx) {
    int nblk = (int)(k / 32);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i flip = _mm256_set1_epi8((char)bias);
    for (int64_t r = 0; r < t; r++)
        for (int b = 0; b < nblk; b++) {
            const uint16_t *xp = x + r * k + 32 * b;
            __m256 v[4];
            for (int i = 0; i < 4; i++) v[i] = bf16_8(xp + 8 * i);
            __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                     _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
            float amax = _mm_cvtss_f32(m4);
            float d = amax / 127.0f;
            __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i q[4];
            for (int i = 0; i < 4; i++) /* round half to even (the default MXCSR mode) */
                q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
            /* int32 -> int16 -> int8, saturating (as vpmovsdb), then back in input order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, order);
            _mm256_storeu_si256((__m256i *)(xq + r * k + 32 * b), _mm256_xor_si256(p, flip));
            /* the sum of the stored (saturated) codes */
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            dx[r * nblk + b] = d;
            sx[r * nblk + b] = d * (float)_mm_cvtsi128_si32(s4);
        }
}

static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *tile, int nblk, const int8_t *xq, int64_t k, const float *dx,
    const float *sx, int rb, uint16_t *y, int64_t ldy) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 tot[ROWS][2];
    for (int r = 0; r < ROWS; r++) tot[r][0] = tot[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *c = tile + (int64_t)b * TILE_BYTES;
        const char *pf = (const char *)(c + PF_BLOCKS * TILE_BYTES);
        for (int l = 0; l < TILE_BYTES; l += 64) _mm_prefetch(pf + l, _MM_HINT_NTA);
        __m256i acc[ROWS][2]; /* int16: outputs 0..7, 8..15 */
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(c + 64 * g));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(c + 64 * g + 32));
            __m256i lo0 = _mm256_and_si256(w0, low), hi0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), low);
            __m256i lo1 = _mm256_and_si256(w1, low), hi1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), low);
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                const int8_t *xr = xq + r * k + 32 * (int64_t)b + 8 * g;
                __m256i xl = _mm256_set1_epi32(*(const int32_t *)xr);
                __m256i xh = _mm256_set1_epi32(*(const int32_t *)(xr + 4));
                acc[r][0] = _mm256_add_epi16(acc[r][0], _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo0, xl), _mm256_maddubs_epi16(hi0, xh)));
                acc[r][1] = _mm256_add_epi16(acc[r][1], _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo1, xl), _mm256_maddubs_epi16(hi1, xh)));
                KEEP2(acc[r][0], acc[r][1]);
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c + 256 + 16 * h)));
            __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c + 288 + 16 * h)));
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r][h], ones));
                tot[r][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, _mm256_set1_ps(dx[r * nblk + b])), tot[r][h]);
                tot[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(sx[r * nblk + b]), m, tot[r][h]);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        store_bf16_8(y + r * ldy, cvtne_bf16_8(tot[r][0]));
        store_bf16_8(y + r * ldy + 8, cvtne_bf16_8(tot[r][1]));
    }
}

static inline __attribute__((always_inline)) void q8_tile_rows(
    const uint8_t *tile, int nblk, const int8_t *xq, int64_t k, const float *dx, int rb,
    uint16_t *y, int64_t ldy) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 tot[ROWS][2];
    for (int r = 0; r < ROWS; r++) tot[r][0] = tot[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *c = tile + (int64_t)b * Q8_TILE_BYTES;
        const char *pf = (const char *)(c + 8 * Q8_TILE_BYTES);
        for (int l = 0; l < Q8_TILE_BYTES; l += 64) _mm_prefetch(pf + l, _MM_HINT_NTA);
        __m256i acc[ROWS][2];
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int p = 0; p < 8; p++) {
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(c + 64 * p));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(c + 64 * p + 32));
            __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1); /* -128: 0x80 = 128 */
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                __m256i xp = _mm256_set1_epi32(*(const int32_t *)(xq + r * k + 32 * (int64_t)b + 4 * p));
                acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(
                    _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xp, w0)), ones));
                acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(
                    _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xp, w1)), ones));
                KEEP2(acc[r][0], acc[r][1]);
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c + 512 + 16 * h)));
            for (int r = 0; r < ROWS; r++) {
                if (r >= rb) break;
                __m256 f = _mm256_cvtepi32_ps(acc[r][h]); /* exact: |sum| <= 32 * 128 * 127 */
                tot[r][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(d, _mm256_set1_ps(dx[r * nblk + b])), tot[r][h]);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        store_bf16_8(y + r * ldy, cvtne_bf16_8(tot[r][0]));
        store_bf16_8(y + r * ldy + 8, cvtne_bf16_8(tot[r][1]));
    }
}

#endif

#ifdef DW_INT4

int dw_int4_ok(void) { return 1; }

/* Row counts as compile-time constants, so the accumulators stay in registers. */
#define CASE(n) case n: tile_rows(tile, nblk, xq, k, dx, sx, n, y, ldy); break;
static void tile_any(const uint8_t *tile, int nblk, const int8_t *xq, int64_t k,
                     const float *dx, const float *sx, int rb, uint16_t *y, int64_t ldy) {
#if ROWS > 4
    switch (rb) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) }
#else
    switch (rb) { CASE(1) CASE(2) CASE(3) CASE(4) }
#endif
}

/* quantise_rows, a prompt chunk's rows (quant_split_rows or more) split between the
 * threads: each row's codes and scales are its own either way (the tests compare both). */
static int quant_split_rows = 16;

/* Sets quant_split_rows (0: never split; -1 leaves it) and returns it. */
int dw_int4_split_rows(int rows) {
    if (rows >= 0) quant_split_rows = rows;
    return quant_split_rows;
}

static void quantise_par(const uint16_t *x, int64_t t, int64_t k, uint8_t bias, int8_t *xq,
                         float *dx, float *sx, int threads) {
    int64_t nblk = k / 32;
    if (threads < 2 || quant_split_rows < 1 || t < quant_split_rows) {
        quantise_rows(x, t, k, bias, xq, dx, sx);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < t; r++)
        quantise_rows(x + r * k, 1, k, bias, xq + r * k, dx + r * nblk, sx + r * nblk);
}

/* The quantised rows: one allocation for codes and scales (NULL when it fails). */
static int8_t *alloc_rows(int64_t t, int64_t k, float **dx, float **sx) {
    int64_t nb = t * (k / 32);
    size_t codes = ((size_t)(t * k) + 63) & ~(size_t)63;
    int8_t *buf = (int8_t *)malloc(codes + sizeof(float) * (size_t)(2 * nb + 1));
    if (buf == NULL) return NULL;
    *dx = (float *)(buf + codes);
    *sx = *dx + nb;
    return buf;
}

/* x (T, K) bfloat16, packed (N / 16, K / 32, 320) bytes, y (T, N) bfloat16. Returns 0, or
 * 1 when the quantised rows could not be allocated. */
int dw_int4_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
               uint16_t *y, int threads) {
    int nblk = (int)(k / 32);
    int64_t tiles = n / 16;
    float *dx, *sx;
    int8_t *xq = alloc_rows(t, k, &dx, &sx);
    if (xq == NULL) return 1;
    quantise_par(x, t, k, 0, xq, dx, sx, threads);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tiles > 1)
    for (int64_t j = 0; j < tiles; j++) {
        const uint8_t *tile = packed + j * (int64_t)nblk * TILE_BYTES;
        for (int64_t r0 = 0; r0 < t; r0 += ROWS) {
            int rb = (int)(t - r0 < ROWS ? t - r0 : ROWS);
            tile_any(tile, nblk, xq + r0 * k, k, dx + r0 * nblk, sx + r0 * nblk, rb,
                     y + r0 * n + 16 * j, n);
        }
    }
    free(xq);
    return 0;
}

#define QCASE(n) case n: q8_tile_rows(tile, nblk, xu, k, dx, n, y, ldy); break;
static void q8_tile_any(const uint8_t *tile, int nblk, const int8_t *xu, int64_t k,
                        const float *dx, int rb, uint16_t *y, int64_t ldy) {
#if ROWS > 4
    switch (rb) { QCASE(1) QCASE(2) QCASE(3) QCASE(4) QCASE(5) QCASE(6) QCASE(7) QCASE(8) }
#else
    switch (rb) { QCASE(1) QCASE(2) QCASE(3) QCASE(4) }
#endif
}

/* x (T, K) bfloat16, packed (N / 16, K / 32, 576) bytes, y (T, N) bfloat16. Returns 0, or
 * 1 when the quantised rows could not be allocated. */
int dw_q8_mm(const uint16_t *x, int64_t t, int64_t k, const uint8_t *packed, int64_t n,
             uint16_t *y, int threads) {
    int nblk = (int)(k / 32);
    int64_t tiles = n / 16;
    float *dx, *sx;
    int8_t *xu = alloc_rows(t, k, &dx, &sx);
    if (xu == NULL) return 1;
    quantise_par(x, t, k, Q8_BIAS, xu, dx, sx, threads);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tiles > 1)
    for (int64_t j = 0; j < tiles; j++) {
        const uint8_t *tile = packed + j * (int64_t)nblk * Q8_TILE_BYTES;
        for (int64_t r0 = 0; r0 < t; r0 += ROWS) {
            int rb = (int)(t - r0 < ROWS ? t - r0 : ROWS);
            q8_tile_any(tile, nblk, xu + r0 * k, k, dx + r0 * nblk, rb, y + r0 * n + 16 * j, n);
        }
    }
    free(xu);
    return 0;
}

#else

int dw_int4_ok(void) { return 0; }

int dw_int4_split_rows(int rows) {
    (void)rows;
    return 0;
}

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
