/* The ReDrafter drafting step in one call (draftwise/backends/cuda/redrafter/native.py
 * prepares the weights and checks every argument; the torch step in step.py is the
 * reference and the fallback).
 *
 * Per row r of the B beams (float32 activations, int8 weights with one float scale per
 * output row; C = hidden, D = context width, K = draft vocabulary, E = extra ids):
 *   e   = embed[token_r]                                   (C)   bfloat16 row, widened
 *   s   = SiLU(W e + b_w + U s_prev[parent_r])              (C)   U term only after step 1
 *   q   = hq + Q_se [s, e]                                  (D)   with a context (D > 0)
 *   a_h = softmax over the m entries and a "nowhere" slot of q_h . key_h / sqrt(D / H)
 *   o   = sum_j a_j value_j                                 (D)
 *   z0  = s + W_o o + b_o                                   (C)   (z0 = s without context)
 *   x   = [h, z0] + SiLU(hr + R_s z0), then x += SiLU(R_i x + b_i) for the other blocks
 *   z   = P x + b_p                                         (C)
 *   l   = [H z + b_h, embed[extra] z + xbias]               (K + E)
 * out[r] is log_softmax(l) without a context; with one, the normalized probabilities
 *   p = (1 - g) softmax(l) + g copy + EPS,  g = sigmoid(hg + G [s, o]),
 * copy putting head 0's weight a_j on column cols[j] (the caller takes the log).
 *
 * The matrix-vector products read each int8 weight once for all B rows, four outputs at
 * a time (independent FMA chains), or sixteen in a tile (tile_mv, where avx512_vnni
 * exists), split over threads by output; each output is one thread's dot product in
 * input order, so the result does not depend on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DW_RD 1
#endif

typedef struct {
    const int8_t *w;    /* (n, k) codes, row-major */
    const float *scale; /* (n,) */
    const float *bias;  /* (n,) or NULL */
    const uint8_t *wu;  /* (n, k) the codes + 128 (vpdpbusd's unsigned side), or NULL */
    const uint8_t *w4;  /* (n, k / 2) a layer's codes in -7..7, + 8, two a byte (in each
                         * group of 32 inputs, byte t: code t low, code 16 + t high), read
                         * by the int8 products in place of w or wu (k % 64 == 0), or NULL */
    int64_t n, k;       /* n % 4 == 0, k % 16 == 0 (checked by the caller) */
    const uint16_t *gs; /* (n, k / 32) bfloat16: the codes' scale for each 32 inputs of a
                         * row (then scale is 1), or NULL; with w4 set (k % 64 == 0) */
    const uint8_t *tw;  /* (n / 16, k / 32, 256) the same 4-bit codes + 8 in tiles of 16
                         * outputs x 32 inputs (tile_mv), or NULL */
    const uint16_t *tg; /* (n / 16, k / 32, 16) gs in the tiles' order, or NULL */
} DwI8;

typedef struct {
    int64_t c, d, heads, kdraft, vocab, nres; /* nres: ResBlocks after the first */
    DwI8 w, u, res_s, proj, head, q_se, wo;
    const DwI8 *res;       /* (nres,) 2C x 2C */
    const float *g_so;     /* (C + D,) the gate's weights on [s, o] */
    const uint16_t *embed; /* (vocab, C) bfloat16 */
} DwRdNet;

typedef struct {
    const float *h, *hr, *hq; /* (C,), (2C,), (D,): h's parts, biases included */
    float hg, xbias;
    const float *keys, *vals; /* (m, D) */
    const int64_t *cols;      /* (m,) column of each entry's next token, -1: none */
    int64_t m;
    const int64_t *extra; /* (E,) target ids of the extra columns */
    int64_t e;
} DwRdProposal;

#define COPY_EPS 1e-9f
#define PF_GROUPS 4 /* output groups of 4 rows prefetched ahead */

int dw_rd_ok(void) {
#ifdef DW_RD
    return 1;
#else
    return 0;
#endif
}

#ifdef DW_RD

/* The 8 lanes of v summed (in this order: the AVX2 vsum, and the AVX2 int8 products' on
 * an AVX-512 CPU without avx512_vnni, where vf is 16 lanes wide). */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

#if defined(__AVX512F__)
typedef __m512 vf;
#define VL 16
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vcodes(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline vf vbf16(const uint16_t *p) { /* VL bfloat16 numbers widened */
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); } /* NaN in a: b */
static inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
#else
typedef __m256 vf;
#define VL 8
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vf vcodes(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline float vsum(vf v) { return hsum8(v); }
static inline vf vbf16(const uint16_t *p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline float vhmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif

static inline float bf16f(uint16_t b) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* x[i] = SiLU(x[i]) for i < n (16 lanes at a time with dw_exp16 where AVX-512 exists, 8
 * with dw_exp8 elsewhere: -x is clamped to 88, where exp is still finite and SiLU is -0
 * to float precision). */
static void silu_n(float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f), top = _mm512_set1_ps(88.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 e = dw_exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), v), top));
        _mm512_storeu_ps(x + i, _mm512_div_ps(v, _mm512_add_ps(one, e)));
    }
#else
    const __m256 one = _mm256_set1_ps(1.0f), top = _mm256_set1_ps(88.0f);
    for (; i + 8 <= n; i += 8) { /* the same on 8 lanes (dw_exp8) */
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = dw_exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), v), top));
        _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
    }
#endif
    for (; i < n; i++) x[i] = silu(x[i]);
}

/* y[r, n0..n0+3] for rb rows (a compile-time constant below): four outputs' dot
 * products with rb rows of x, 4 x rb accumulators. A layer with a scale per 32 inputs
 * (gs) multiplies each code by its group's scale. */
static inline __attribute__((always_inline)) void dot4(
    const DwI8 *L, int64_t n0, const float *x, int64_t ldx, int rb, float *y, int64_t ldy) {
    const int64_t k = L->k, ng = k / 32;
    const int8_t *w0 = L->w + n0 * k;
    const uint16_t *g0 = L->gs != NULL ? L->gs + n0 * ng : NULL; /* (4, ng) */
    vf acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 4; r++) acc[i][r] = vzero();
    /* the weights come cold (the target's forward evicted them): prefetch the group
     * PF_GROUPS ahead, one line a step (4 rows of k codes are 4k / 64 lines, and this loop
     * takes k / VL steps); prefetching past the matrix's end is harmless */
    const char *ahead = (const char *)(w0 + PF_GROUPS * 4 * k);
    const int64_t line = (4 * k / 64) * 64 / (k / VL);
    for (int64_t j = 0; j < k; j += VL) {
        _mm_prefetch(ahead + (j / VL) * line, _MM_HINT_T0);
        vf c0 = vcodes(w0 + j), c1 = vcodes(w0 + k + j);
        vf c2 = vcodes(w0 + 2 * k + j), c3 = vcodes(w0 + 3 * k + j);
        if (g0 != NULL) {
            const int64_t g = j / 32;
            c0 = vmul(c0, vset1(bf16f(g0[g])));
            c1 = vmul(c1, vset1(bf16f(g0[ng + g])));
            c2 = vmul(c2, vset1(bf16f(g0[2 * ng + g])));
            c3 = vmul(c3, vset1(bf16f(g0[3 * ng + g])));
        }
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            vf xv = vload(x + r * ldx + j);
            acc[0][r] = vfma(c0, xv, acc[0][r]);
            acc[1][r] = vfma(c1, xv, acc[1][r]);
            acc[2][r] = vfma(c2, xv, acc[2][r]);
            acc[3][r] = vfma(c3, xv, acc[3][r]);
        }
    }
    for (int i = 0; i < 4; i++) {
        float sc = L->scale[n0 + i], b = L->bias ? L->bias[n0 + i] : 0.0f;
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            y[r * ldy + n0 + i] = vsum(acc[i][r]) * sc + b;
        }
    }
}

#define DCASE(n) case n: dot4(L, n0, x + r0 * ldx, ldx, n, y + r0 * ldy, ldy); break;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define RD_Q 1 /* vpdpbusd */
#else
#define RD_Q 2 /* vpmaddubsw (AVX2) */
#endif
#define QB 64
static int rd_vnni = 1; /* dw_rd_use_vnni(0): the float32 products (tests compare both) */

#if RD_Q == 1
/* With avx512_vnni the products are exact int32 sums of vpdpbusd: the codes + 128 (``wu``,
 * unsigned) times the activations quantised to int8 per group of 4 inputs (a group's
 * scale dx = max |x| / 127, q = x / dx rounded to nearest even). A vpdpbusd lane sums
 * one group's 4 products; the + 128 adds 128 x the group's sum of q (xs, (b, k / 4)
 * int32, made here once per row by one vpdpbusd on ones), taken off in int32, so each
 * lane holds the group's exact sum of w q; the 16 scales of 64 inputs are one vector,
 * multiplied in after one conversion:
 *   y = scale * sum_g dx_g * sum_{i in g} w_i q_i + bias.
 * 5 instructions per output and 64 inputs where the float32 path spends 16 (two
 * conversions a code). The 4-bit layers read their codes packed (``w4``: + 8, 0..15,
 * two a byte; half the bytes), unpacked by a lane shuffle, a per-lane shift and a mask,
 * and take off 8 x xs instead: the same int32 sums, so the same bits (AMD EPYC Zen 4, 2
 * threads, a three-token chain in a live decode, 26 Spec-Bench prompts alternating:
 * 0.51-0.53 ms against 0.66-0.71 with the head and the cell read as bytes; 0.26 against
 * 0.24 warm). The drafts can differ from the float32 path's at near-ties (the target
 * verifies every token). */
/* x (b, k) rows, row stride ldx -> xq (b, k) int8 q, dx (b, k / 4) the groups' scales,
 * xs (b, k / 4) the groups' sums of q. */
static void quant_rows(const float *x, int64_t ldx, int64_t b, int64_t k, int8_t *xq,
                       float *dx, int32_t *xs) {
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48,
                                            52, 56, 60);
    for (int64_t r = 0; r < b; r++) {
        for (int64_t j = 0; j < k; j += QB) {
            const float *xp = x + r * ldx + j;
            float mx[QB];
            for (int u = 0; u < 4; u++) {
                __m512 v = _mm512_loadu_ps(xp + 16 * u), a = _mm512_abs_ps(v);
                a = _mm512_max_ps(a, _mm512_permute_ps(a, 0xB1)); /* pairs */
                a = _mm512_max_ps(a, _mm512_permute_ps(a, 0x4E)); /* groups of 4 */
                __mmask16 nz = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ);
                __m512 inv = _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.0f), a);
                __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v, inv),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm_storeu_si128((__m128i *)(xq + r * k + j + 16 * u), _mm512_cvtsepi32_epi8(q));
                _mm512_storeu_ps(mx + 16 * u, a);
            }
            __m512 d = _mm512_mul_ps(_mm512_i32gather_ps(first, mx, 4), _mm512_set1_ps(1.0f / 127.0f));
            _mm512_storeu_ps(dx + r * (k / 4) + j / 4, d);
            __m512i qs = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones,
                                             _mm512_loadu_si512((const void *)(xq + r * k + j)));
            _mm512_storeu_si512((void *)(xs + r * (k / 4) + j / 4), qs);
        }
    }
}

/* dot4 on quantised rows: y[r, n0..n0+3] for rb rows. W4 (a compile-time constant): the
 * codes read from L->w4 (two 16-byte groups of 32 inputs for 64 inputs: the lanes
 * [A, A, B, B] of 128 bits, the odd lanes shifted right by 4, masked to 0..15); else
 * from L->wu. G (with W4): a scale per 32 inputs (L->gs), lanes 0-7 of a product (the
 * inputs j .. j + 31) times the first, lanes 8-15 the second, folded into the
 * activations' scales: one multiply more per output and 64 inputs. */
static inline __attribute__((always_inline)) void dot4q(
    const DwI8 *L, int64_t n0, const int8_t *xq, const float *dx, const int32_t *xs,
    int rb, float *y, int64_t ldy, const int W4, const int G) {
    const int64_t k = L->k, rowb = W4 ? k / 2 : k; /* a row's bytes */
    const int64_t ng = k / 32; /* a row's group scales (G) */
    const uint8_t *w0 = (W4 ? L->w4 : L->wu) + n0 * rowb;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i nib = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    const __m512i top16 = _mm512_set1_epi32((int32_t)0xFFFF0000);
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
    const char *ahead = (const char *)(w0 + PF_GROUPS * 4 * rowb);
    const char *gahead = G ? (const char *)(L->gs + (n0 + PF_GROUPS * 4) * ng) : NULL;
    for (int64_t j = 0; j < k; j += QB) {
        const int64_t jb = W4 ? j / 2 : j; /* the inputs' first byte in a row */
        for (int i = 0; i < 4; i++) _mm_prefetch(ahead + (int64_t)i * rowb + jb, _MM_HINT_T0);
        __m512 gv[4]; /* G: output i's two group scales, each over 8 lanes */
        if (G) {
            /* the 4 rows' scales ahead: 8 ng bytes, one line an iteration */
            if ((j / QB) * 64 < 8 * ng) _mm_prefetch(gahead + (j / QB) * 64, _MM_HINT_T0);
            for (int i = 0; i < 4; i++) {
                int32_t two; /* bfloat16 scales of inputs j.. (low half) and j + 32.. */
                memcpy(&two, L->gs + (n0 + i) * ng + j / 32, sizeof two);
                __m512i t = _mm512_set1_epi32(two);
                gv[i] = _mm512_castsi512_ps(_mm512_mask_blend_epi32(
                    0xFF00, _mm512_slli_epi32(t, 16), _mm512_and_si512(t, top16)));
            }
        }
        __m512i w[4];
        for (int i = 0; i < 4; i++) {
            if (W4) {
                __m512i b = _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(w0 + (int64_t)i * rowb + jb)));
                b = _mm512_shuffle_i64x2(b, b, 0x50); /* 128-bit lanes 0, 0, 1, 1 */
                w[i] = _mm512_and_si512(_mm512_srlv_epi64(b, nib), low4);
            } else {
                w[i] = _mm512_loadu_si512((const void *)(w0 + (int64_t)i * rowb + jb));
            }
        }
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            __m512i xv = _mm512_loadu_si512((const void *)(xq + r * k + j));
            __m512 dv = _mm512_loadu_ps(dx + r * (k / 4) + j / 4);
            /* the offset: 8 (4-bit) or 128 (int8) x each group's sum of q */
            __m512i sv = _mm512_slli_epi32(
                _mm512_loadu_si512((const void *)(xs + r * (k / 4) + j / 4)), W4 ? 3 : 7);
            for (int i = 0; i < 4; i++) {
                __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, w[i], xv), sv);
                __m512 sc = G ? _mm512_mul_ps(dv, gv[i]) : dv;
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[i][r]);
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        float sc = L->scale[n0 + i], b = L->bias ? L->bias[n0 + i] : 0.0f;
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            y[r * ldy + n0 + i] = _mm512_reduce_add_ps(acc[i][r]) * sc + b;
        }
    }
}

#define QCASE(n) case n: dot4q(L, n0, xq + r0 * L->k, dx + r0 * (L->k / 4), xs + r0 * (L->k / 4), n, y + r0 * ldy, ldy, 0, 0); break;
#define QCASE4(n) case n: dot4q(L, n0, xq + r0 * L->k, dx + r0 * (L->k / 4), xs + r0 * (L->k / 4), n, y + r0 * ldy, ldy, 1, 0); break;
#define QCASEG(n) case n: dot4q(L, n0, xq + r0 * L->k, dx + r0 * (L->k / 4), xs + r0 * (L->k / 4), n, y + r0 * ldy, ldy, 1, 1); break;

/* The tiled path (``tw``: 4-bit layers, n % 16 == 0, k % 32 == 0): a vpdpbusd lane is
 * one OUTPUT, four inputs, as in int4.c's kernel for the target. The activations are
 * int8 per row and block of 32 inputs (d = max |x| / 127, q = x / d rounded to nearest
 * even), so a block's 8 products per output sum in int32 and take one conversion and
 * one FMA for 16 outputs:
 *   y = scale * sum_b d_b (sum_{i in b} (c_i + 8) q_i - 8 sum_{i in b} q_i) [* g_b] + bias,
 * g_b the group scales of a ``gs`` layer (its scale 1). About 28 instructions per 16
 * outputs and 32 inputs where dot4q spends about 80 (five per output and 64 inputs on
 * top of the unpacking). A tile is 256 bytes: in its 64-byte group g (0..3), byte
 * 4 i + e holds output i's codes + 8 of input 8 g + e (low nibble) and 8 g + 4 + e (high).
 * The drafts differ from dot4q's at near-ties (a coarser activation rounding); the
 * target verifies every token. */
#define TB 32
/* x (b, k) rows, row stride ldx -> xq (b, k) int8 q, dx (b, k / 32) the blocks' scales,
 * xs (b, k / 32) -8 x the blocks' sums of q. */
static void quant_rows32(const float *x, int64_t ldx, int64_t b, int64_t k, int8_t *xq,
                         float *dx, int32_t *xs) {
    const int64_t nb = k / TB;
    for (int64_t r = 0; r < b; r++) {
        for (int64_t j = 0; j < nb; j++) {
            const float *xp = x + r * ldx + j * TB;
            __m512 v0 = _mm512_loadu_ps(xp), v1 = _mm512_loadu_ps(xp + 16);
            float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            __m512 inv = _mm512_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
            __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, inv),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, inv),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            int8_t *qp = xq + r * k + j * TB;
            _mm_storeu_si128((__m128i *)qp, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(qp + 16), _mm512_cvtsepi32_epi8(q1));
            dx[r * nb + j] = mx * (1.0f / 127.0f);
            xs[r * nb + j] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

/* y[r, 16 t .. 16 t + 15] for rb rows (a compile-time constant below) from tile row t. */
static inline __attribute__((always_inline)) void tile_rows(
    const DwI8 *L, int64_t t, const int8_t *xq, const float *dx, const int32_t *xs, int rb,
    float *y, int64_t ldy) {
    const int64_t k = L->k, nb = k / TB;
    const uint8_t *w = L->tw + t * nb * 256;
    const uint16_t *tg = L->tg != NULL ? L->tg + t * nb * 16 : NULL;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * 256;
        /* the weights come cold (the target's forward streamed past them): 4 blocks ahead
         * (past the tile row's end, the next row's; past the matrix, harmless) */
        for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(wb + 4 * 256 + 64 * l), _MM_HINT_T0);
        __m512i lo[4], hi[4];
        for (int g = 0; g < 4; g++) {
            __m512i v = _mm512_loadu_si512((const void *)(wb + 64 * g));
            lo[g] = _mm512_and_si512(v, low4);
            hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        __m512 gv = _mm512_set1_ps(1.0f);
        if (tg != NULL) /* 16 bfloat16 group scales, widened */
            gv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                _mm256_loadu_si256((const __m256i *)(tg + b * 16))), 16));
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            const int8_t *xr = xq + r * k + b * TB;
            int32_t x4[8];
            memcpy(x4, xr, sizeof x4);
            /* two chains: the low nibbles' inputs (8 g .. 8 g + 3) and the high ones' */
            __m512i a0 = _mm512_set1_epi32(xs[r * nb + b]), a1 = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                a0 = _mm512_dpbusd_epi32(a0, lo[g], _mm512_set1_epi32(x4[2 * g]));
                a1 = _mm512_dpbusd_epi32(a1, hi[g], _mm512_set1_epi32(x4[2 * g + 1]));
            }
            __m512 sc = _mm512_set1_ps(dx[r * nb + b]);
            if (tg != NULL) sc = _mm512_mul_ps(sc, gv);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), sc, acc[r]);
        }
    }
    __m512 scale = _mm512_loadu_ps(L->scale + 16 * t);
    __m512 bias = L->bias != NULL ? _mm512_loadu_ps(L->bias + 16 * t) : _mm512_setzero_ps();
    for (int r = 0; r < 4; r++) {
        if (r >= rb) break;
        _mm512_storeu_ps(y + r * ldy + 16 * t, _mm512_fmadd_ps(acc[r], scale, bias));
    }
}

#define TCASE(n) case n: tile_rows(L, t, xq + r0 * L->k, dx + r0 * nb, xs + r0 * nb, n, y + r0 * ldy, ldy); break;

static int rd_tiles = 1; /* dw_rd_use_tiles(0): dot4q's products (tests compare both) */

/* i8_mv through the tiles; 1 where scratch memory could not be allocated. */
static int tile_mv(const DwI8 *L, const float *x, int64_t ldx, int64_t b, float *y,
                   int64_t ldy, int threads) {
    const int64_t nb = L->k / TB, tiles = L->n / 16;
    int8_t *xq = (int8_t *)malloc((size_t)(b * L->k) + sizeof(float) * (size_t)(2 * b * nb));
    if (xq == NULL) return 1;
    float *dx = (float *)(xq + b * L->k);
    int32_t *xs = (int32_t *)(dx + b * nb);
    quant_rows32(x, ldx, b, L->k, xq, dx, xs);
    int par = threads > 1 && tiles > 1 && L->n * L->k * (b < 4 ? b : 4) >= (1 << 17);
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t t = 0; t < tiles; t++) {
        for (int64_t r0 = 0; r0 < b; r0 += 4) {
            int rb = (int)(b - r0 < 4 ? b - r0 : 4);
            switch (rb) { TCASE(1) TCASE(2) TCASE(3) TCASE(4) }
        }
    }
    free(xq);
    return 0;
}
#else
/* Without avx512_vnni (AVX2): the same int8 quantisation per group of 4 inputs, and the
 * exact int32 group sums from vpmaddubsw on |code| and the activations with each code's
 * sign moved onto them (|product| <= 128 x 127, so a pair never saturates int16), then
 * vpmaddwd by ones: one group's 4 products a lane, times the group's scale as above, and
 * no + 128 to take off:
 *   y = scale * sum_g dx_g * sum_{i in g} w_i q_i + bias.
 * 6 instructions per output and 32 inputs where the float32 path spends 12. |code| is
 * computed, not stored: a stored copy doubled the bytes a step reads, and the step is
 * bound by them (a three-token chain 0.80-0.85 ms either way on an AMD EPYC Zen 3).
 * The 4-bit layers skip the sign moves: their codes + 8 (0..15, as packed) are
 * vpmaddubsw's unsigned side as they are, and 8 x the group's sum of q (xs, (b, k / 4)
 * int32, made here once per row) comes off each int32 group sum, which is then the same
 * number, so the same bits. */
static void quant_rows(const float *x, int64_t ldx, int64_t b, int64_t k, int8_t *xq,
                       float *dx, int32_t *xs) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    const __m256 sign = _mm256_set1_ps(-0.0f), q127 = _mm256_set1_ps(127.0f);
    for (int64_t r = 0; r < b; r++) {
        for (int64_t j = 0; j < k; j += 32) {
            const float *xp = x + r * ldx + j;
            __m256i q[4];
            for (int u = 0; u < 4; u++) {
                __m256 v = _mm256_loadu_ps(xp + 8 * u), a = _mm256_andnot_ps(sign, v);
                a = _mm256_max_ps(a, _mm256_permute_ps(a, 0xB1)); /* pairs */
                a = _mm256_max_ps(a, _mm256_permute_ps(a, 0x4E)); /* groups of 4 */
                __m256 inv = _mm256_and_ps(_mm256_div_ps(q127, a),
                                           _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ));
                q[u] = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv)); /* nearest even */
                float mx[8];
                _mm256_storeu_ps(mx, a);
                dx[r * (k / 4) + (j + 8 * u) / 4] = mx[0] * (1.0f / 127.0f);
                dx[r * (k / 4) + (j + 8 * u) / 4 + 1] = mx[4] * (1.0f / 127.0f);
            }
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, order);
            _mm256_storeu_si256((__m256i *)(xq + r * k + j), p);
            /* 8 x each group's sum of q (the 4-bit products' offset: see dot4q) */
            _mm256_storeu_si256((__m256i *)(xs + r * (k / 4) + j / 4),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(eight, p), ones));
        }
    }
}

/* dot4 on quantised rows: y[r, n0..n0+3] for rb rows. W4 (a compile-time constant): the
 * codes read from L->w4, four bits each (the same values: the same int32 sums, the same
 * bits; half the bytes), unpacked by one 16-byte broadcast, a per-half shift (vpsrlvd by
 * 0 and 4) and a mask, and multiplied as codes + 8 less xs (see quant_rows): 8
 * instructions per output and 32 inputs against 12 with the sign moves and a 128-bit
 * unpacking (AMD EPYC Zen 3: the 4096-row draft head 168 -> 98 us a chain step on one
 * thread, a three-token chain 0.62-0.67 -> 0.50-0.54 ms on two, warm). */
static inline __attribute__((always_inline)) void dot4q(
    const DwI8 *L, int64_t n0, const int8_t *xq, const float *dx, const int32_t *xs,
    int rb, float *y, int64_t ldy, const int W4, const int G) {
    const int64_t k = L->k, rowb = W4 ? k / 2 : k; /* a row's bytes */
    const int64_t ng = k / 32; /* a row's group scales (G: one per 32 inputs, L->gs) */
    const uint8_t *w0 = W4 ? L->w4 + n0 * rowb : (const uint8_t *)L->w + n0 * k;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i nib = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    __m256 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < 4; r++) acc[i][r] = _mm256_setzero_ps();
    const char *ahead = (const char *)(w0 + PF_GROUPS * 4 * rowb);
    const char *gahead = G ? (const char *)(L->gs + (n0 + PF_GROUPS * 4) * ng) : NULL;
    for (int64_t j = 0; j < k; j += 32) {
        const int64_t jb = W4 ? j / 2 : j; /* the inputs' first byte in a row */
        if (j % QB == 0)
            for (int i = 0; i < 4; i++) _mm_prefetch(ahead + (int64_t)i * rowb + jb, _MM_HINT_T0);
        __m256 gv[4]; /* G: output i's scale of inputs j .. j + 31 */
        if (G) {
            if (j % QB == 0 && (j / QB) * 64 < 8 * ng)
                _mm_prefetch(gahead + (j / QB) * 64, _MM_HINT_T0);
            for (int i = 0; i < 4; i++) gv[i] = _mm256_set1_ps(bf16f(L->gs[(n0 + i) * ng + j / 32]));
        }
        __m256i w[4];
        for (int i = 0; i < 4; i++) {
            if (W4) { /* 16 bytes in both halves: codes j..j+15 low, j+16..j+31 high, each
                       * + 8 (0..15, vpmaddubsw's unsigned side as they are) */
                __m256i b = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(w0 + (int64_t)i * rowb + jb)));
                w[i] = _mm256_and_si256(_mm256_srlv_epi32(b, nib), low4);
            } else {
                w[i] = _mm256_loadu_si256((const __m256i *)(w0 + (int64_t)i * rowb + jb));
            }
        }
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * k + j));
            __m256 dv = _mm256_loadu_ps(dx + r * (k / 4) + j / 4);
            if (W4) { /* sum (w + 8) q - 8 sum q: the same int32 sums as below */
                __m256i sv = _mm256_loadu_si256((const __m256i *)(xs + r * (k / 4) + j / 4));
                for (int i = 0; i < 4; i++) {
                    __m256i p = _mm256_sub_epi32(
                        _mm256_madd_epi16(_mm256_maddubs_epi16(w[i], xv), ones), sv);
                    __m256 sc = G ? _mm256_mul_ps(dv, gv[i]) : dv;
                    acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[i][r]);
                }
                continue;
            }
            for (int i = 0; i < 4; i++) {
                __m256i p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_abs_epi8(w[i]), _mm256_sign_epi8(xv, w[i])), ones);
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv, acc[i][r]);
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        float sc = L->scale[n0 + i], b = L->bias ? L->bias[n0 + i] : 0.0f;
        for (int r = 0; r < 4; r++) {
            if (r >= rb) break;
            y[r * ldy + n0 + i] = hsum8(acc[i][r]) * sc + b;
        }
    }
}

#define QCASE(n) case n: dot4q(L, n0, xq + r0 * L->k, dx + r0 * (L->k / 4), xs + r0 * (L->k / 4), n, y + r0 * ldy, ldy, 0, 0); break;
#define QCASE4(n) case n: dot4q(L, n0, xq + r0 * L->k, dx + r0 * (L->k / 4), xs + r0 * (L->k / 4), n, y + r0 * ldy, ldy, 1, 0); break;
#define QCASEG(n) case n: dot4q(L, n0, xq + r0 * L->k, dx + r0 * (L->k / 4), xs + r0 * (L->k / 4), n, y + r0 * ldy, ldy, 1, 1); break;
#endif

/* Which int8 products this build has: 1 vpdpbusd (avx512_vnni, reading ``wu``: the codes
 * + 128), 2 vpmaddubsw (AVX2, the codes alone). */
int dw_rd_vnni(void) { return RD_Q; }

/* Take the int8 products (on = 1, the default) or the float32 ones (on = 0: tests compare
 * both). */
void dw_rd_use_vnni(int on) { rd_vnni = on != 0; }

/* Whether this build has the tiled products (tile_mv: avx512_vnni), and take them (on =
 * 1, the default) or dot4q's (on = 0: tests compare both). */
int dw_rd_tiles(void) {
#if RD_Q == 1
    return 1;
#else
    return 0;
#endif
}
void dw_rd_use_tiles(int on) {
#if RD_Q == 1
    rd_tiles = on != 0;
#else
    (void)on;
#endif
}

/* y (b, n) with row stride ldy = x (b, k) with row stride ldx times L's weights, plus
 * its bias. */
static void i8_mv(const DwI8 *L, const float *x, int64_t ldx, int64_t b, float *y,
                  int64_t ldy, int threads) {
#if RD_Q == 1
    if (rd_vnni && rd_tiles && L->tw != NULL && tile_mv(L, x, ldx, b, y, ldy, threads) == 0)
        return; /* (no memory for the tiles' scratch: the products below, which try again) */
#endif
    int64_t groups = L->n / 4;
    int par = threads > 1 && L->n * L->k * (b < 4 ? b : 4) >= (1 << 17);
    int8_t *xq = NULL; /* the quantised rows where the int8 products run, else NULL */
    float *dx = NULL;
    int32_t *xs = NULL;
    /* (a layer with group scales is read packed: without w4, the float32 products) */
    if (rd_vnni && (RD_Q == 2 || L->wu != NULL || L->w4 != NULL) && L->k % QB == 0
        && (L->gs == NULL || L->w4 != NULL)) {
        /* xq (b, k) int8, dx (b, k / 4), xs (b, k / 4) int32 (the groups' sums of q):
         * the float parts start 64-aligned (no memory: the float32 products) */
        xq = (int8_t *)malloc((size_t)(b * L->k) + sizeof(float) * (size_t)(2 * b * (L->k / 4)));
        if (xq != NULL) {
            dx = (float *)(xq + b * L->k);
            xs = (int32_t *)(dx + b * (L->k / 4));
            quant_rows(x, ldx, b, L->k, xq, dx, xs);
        }
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t g = 0; g < groups; g++) {
        int64_t n0 = 4 * g;
        for (int64_t r0 = 0; r0 < b; r0 += 4) {
            int rb = (int)(b - r0 < 4 ? b - r0 : 4);
            if (xq != NULL) {
                if (L->gs != NULL) {
                    switch (rb) { QCASEG(1) QCASEG(2) QCASEG(3) QCASEG(4) }
                    continue;
                }
                if (L->w4 != NULL) {
                    switch (rb) { QCASE4(1) QCASE4(2) QCASE4(3) QCASE4(4) }
                    continue;
                }
                switch (rb) { QCASE(1) QCASE(2) QCASE(3) QCASE(4) }
                continue;
            }
            switch (rb) { DCASE(1) DCASE(2) DCASE(3) DCASE(4) }
        }
    }
    free(xq);
}

/* Dot products, sums and maxima in VL lanes (a fixed order for a given n): the scalar
 * loops they replace were latency-bound chains, 0.25 ms a chain step at a 1,000-token
 * context (its entries' scores and extra ids). */
static float dot_f(const float *a, const float *b, int64_t n) {
    vf acc = vzero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL) acc = vfma(vload(a + i), vload(b + i), acc);
    float t = vsum(acc);
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

/* a (n) float32 . row (n) bfloat16 */
static float dot_bf(const float *a, const uint16_t *row, int64_t n) {
    vf acc = vzero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL) acc = vfma(vload(a + i), vbf16(row + i), acc);
    float t = vsum(acc);
    for (; i < n; i++) t += a[i] * bf16f(row[i]);
    return t;
}

static float sum_of(const float *x, int64_t n) {
    vf acc = vzero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL) acc = vadd(acc, vload(x + i));
    float t = vsum(acc);
    for (; i < n; i++) t += x[i];
    return t;
}

/* Element i of a residual row x: float32 (x_bf16 = 0) or bfloat16 (1), the target's own
 * dtype, so the caller passes its tensor's memory as it is (widening a bfloat16 number
 * to float32 is exact: the same value as a float32 copy of the row). */
static inline float row_at(const void *x, int x_bf16, int64_t i) {
    return x_bf16 ? bf16f(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* h (C) = RMSNorm(x) * norm, x a residual row (row_at). */
static void final_norm(const void *x, int x_bf16, const float *norm, float eps, int64_t c,
                       float *h) {
    float ss = 0.0f;
    for (int64_t i = 0; i < c; i++) {
        float v = row_at(x, x_bf16, i);
        ss += v * v;
    }
    float r = 1.0f / sqrtf(ss / (float)c + eps);
    for (int64_t i = 0; i < c; i++) h[i] = row_at(x, x_bf16, i) * r * norm[i];
}

/* A proposal's start: h = RMSNorm(x) * norm (the target's last hidden state from its
 * residual row x (C), float32 or bfloat16: row_at), then its parts: hr (2C) = R_h h + b,
 * hq (D) = Q_h h + b and hg = g_h . h + g_b (with a context: q_h and g_h not NULL). */
int dw_rd_start(const DwI8 *res_h, const DwI8 *q_h, const float *g_h, float g_b,
                const void *x, int x_bf16, const float *norm, float eps, int64_t c, float *h,
                float *hr, float *hq, float *hg, int threads) {
    final_norm(x, x_bf16, norm, eps, c, h);
    i8_mv(res_h, h, c, 1, hr, res_h->n, threads);
    if (q_h != NULL) {
        i8_mv(q_h, h, c, 1, hq, q_h->n, threads);
        *hg = g_b + dot_f(g_h, h, c);
    }
    return 0;
}

/* cnt new context entries: entry i stands for token tok[i] with the target's hidden
 * states g_{i-1} and g_i (the residual rows rows[i] and rows[i + 1], each (C) float32 or
 * bfloat16 as x_bf16 says, normalised here as in dw_rd_start) and the token that
 * followed, tok[i + 1]:
 *   keys[i] = W_k [g_{i-1}, e(tok[i])] + b_k,  vals[i] = W_v [e(tok[i + 1]), g_i] + b_v.
 * rows holds cnt + 1 pointers (the caller checks them). Returns 1 when scratch memory
 * could not be allocated. */
int dw_rd_entries(const DwI8 *wk, const DwI8 *wv, const void *const *rows, int x_bf16,
                  int64_t cnt, const float *norm, float eps, const uint16_t *embed,
                  const int64_t *tok, int64_t c, float *keys, float *vals, int threads) {
    const int64_t c2 = 2 * c;
    float *g = (float *)malloc(sizeof(float) * (size_t)((cnt + 1) * c + 2 * cnt * c2 + 1));
    if (g == NULL) return 1;
    float *kin = g + (cnt + 1) * c, *vin = kin + cnt * c2;
    for (int64_t i = 0; i <= cnt; i++) final_norm(rows[i], x_bf16, norm, eps, c, g + i * c);
    for (int64_t i = 0; i < cnt; i++) {
        const uint16_t *e0 = embed + tok[i] * c, *e1 = embed + tok[i + 1] * c;
        for (int64_t j = 0; j < c; j++) {
            kin[i * c2 + j] = g[i * c + j];
            kin[i * c2 + c + j] = bf16f(e0[j]);
            vin[i * c2 + j] = bf16f(e1[j]);
            vin[i * c2 + c + j] = g[(i + 1) * c + j];
        }
    }
    i8_mv(wk, kin, c2, cnt, keys, wk->n, threads);
    i8_mv(wv, vin, c2, cnt, vals, wv->n, threads);
    free(g);
    return 0;
}

/* x[i] = exp(x[i] - mx) for i < n; returns their sum (in a fixed order). */
static float exp_shift(float *x, int64_t n, float mx) {
    float tot = 0.0f;
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps(), m = _mm512_set1_ps(mx);
    for (; i + 16 <= n; i += 16) {
        __m512 v = dw_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, v);
        acc = _mm512_add_ps(acc, v);
    }
    tot = _mm512_reduce_add_ps(acc);
#else
    __m256 acc = _mm256_setzero_ps(), m = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8) {
        __m256 v = dw_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    tot = dw_hsum8(acc);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        tot += x[i];
    }
    return tot;
}

/* The largest of x[0..n) (NaN ignored; -inf when there is none). */
static float max_of(const float *x, int64_t n) {
    vf acc = vset1(-INFINITY);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) acc = vmax(vload(x + i), acc);
    float mx = vhmax(acc);
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* The first i with x[i] == max_of(x, n) (0 when every entry is NaN). */
static int64_t argmax_of(const float *x, int64_t n) {
    float mx = max_of(x, n);
    for (int64_t i = 0; i < n; i++)
        if (x[i] == mx) return i;
    return 0;
}

/* Attention of one row's query q (D) over the proposal's m entries and the nowhere
 * slot, per head; o (D) the read-out, w0 (m) head 0's weights. sc: m + 1 floats. */
static void attend_scalar(const DwRdNet *net, const DwRdProposal *pr, const float *q, float *o,
                   float *w0, float *sc) {
    int64_t d = net->d, nh = net->heads, dh = d / nh, m = pr->m;
    float scale = 1.0f / sqrtf((float)dh);
    for (int64_t h = 0; h < nh; h++) {
        const float *qh = q + h * dh;
        for (int64_t j = 0; j < m; j++) sc[j] = dot_f(qh, pr->keys + j * d + h * dh, dh) * scale;
        sc[m] = 0.0f; /* attend nowhere */
        float tot = exp_shift(sc, m + 1, max_of(sc, m + 1));
        float *oh = o + h * dh;
        for (int64_t i = 0; i < dh; i++) oh[i] = 0.0f;
        for (int64_t j = 0; j < m; j++) {
            float a = sc[j] / tot;
            const float *v = pr->vals + j * d + h * dh;
            for (int64_t i = 0; i < dh; i++) oh[i] += a * v[i];
            if (h == 0) w0[j] = a;
        }
    }
}

#if defined(__AVX512F__)
/* attend_scalar for one head of 16 NV dimensions (a compile-time constant), in 16 lanes:
 * the scores of 16 entries at a time (each entry's NV fused multiply-adds, then
 * sum16x16), the read-out with the entries alternating between two accumulator sets.
 * At 1,000 entries a chain step's four heads took about 0.03 ms with the scalar loops. */
static inline __attribute__((always_inline)) void attend_head(
    const float *qh, const float *keys, const float *vals, int64_t d, int64_t m, float scale,
    float *oh, float *w0, float *sc, const int NV) {
    __m512 qv[8], a[16];
    for (int v = 0; v < NV; v++) qv[v] = _mm512_loadu_ps(qh + 16 * v);
    int64_t j = 0;
    for (; j + 16 <= m; j += 16) {
        for (int u = 0; u < 16; u++) {
            const float *k = keys + (j + u) * d;
            a[u] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
            for (int v = 1; v < NV; v++) a[u] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(k + 16 * v), a[u]);
        }
        _mm512_storeu_ps(sc + j, _mm512_mul_ps(sum16x16(a), _mm512_set1_ps(scale)));
    }
    for (; j < m; j++) sc[j] = dot_f(qh, keys + j * d, 16 * NV) * scale;
    sc[m] = 0.0f; /* attend nowhere */
    float tot = exp_shift(sc, m + 1, max_of(sc, m + 1));
    __m512 acc[2][8];
    for (int w = 0; w < 2; w++)
        for (int v = 0; v < NV; v++) acc[w][v] = _mm512_setzero_ps();
    for (j = 0; j < m; j++) {
        float aj = sc[j] / tot;
        if (w0 != NULL) w0[j] = aj;
        __m512 p = _mm512_set1_ps(aj);
        const float *vr = vals + j * d;
        if (j % 2)
            for (int v = 0; v < NV; v++) acc[1][v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * v), acc[1][v]);
        else
            for (int v = 0; v < NV; v++) acc[0][v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * v), acc[0][v]);
    }
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(oh + 16 * v, _mm512_add_ps(acc[0][v], acc[1][v]));
}
#else
/* The same on 8 lanes (AVX2): head size 8 NV, 8 entries' scores at a time (dw_sum8x8),
 * one accumulator set for the read-out. */
static inline __attribute__((always_inline)) void attend_head(
    const float *qh, const float *keys, const float *vals, int64_t d, int64_t m, float scale,
    float *oh, float *w0, float *sc, const int NV) {
    __m256 qv[16], a[8];
    for (int v = 0; v < NV; v++) qv[v] = _mm256_loadu_ps(qh + 8 * v);
    int64_t j = 0;
    for (; j + 8 <= m; j += 8) {
        for (int u = 0; u < 8; u++) {
            const float *k = keys + (j + u) * d;
            a[u] = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k));
            for (int v = 1; v < NV; v++) a[u] = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(k + 8 * v), a[u]);
        }
        _mm256_storeu_ps(sc + j, _mm256_mul_ps(dw_sum8x8(a), _mm256_set1_ps(scale)));
    }
    for (; j < m; j++) sc[j] = dot_f(qh, keys + j * d, 8 * NV) * scale;
    sc[m] = 0.0f; /* attend nowhere */
    float tot = exp_shift(sc, m + 1, max_of(sc, m + 1));
    __m256 acc[16];
    for (int v = 0; v < NV; v++) acc[v] = _mm256_setzero_ps();
    for (j = 0; j < m; j++) {
        float aj = sc[j] / tot;
        if (w0 != NULL) w0[j] = aj;
        __m256 p = _mm256_set1_ps(aj);
        const float *vr = vals + j * d;
        for (int v = 0; v < NV; v++) acc[v] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * v), acc[v]);
    }
    for (int v = 0; v < NV; v++) _mm256_storeu_ps(oh + 8 * v, acc[v]);
}
#endif

/* attend_scalar's results, vectorised for head sizes 32, 64 and 128; sc: heads x (m + 1)
 * floats. The heads go to the threads (one head start to end on one thread, so the
 * result does not depend on the thread count) from ATTEND_PAR entries on: at 670 entries
 * the serial heads were a fifth of a chain's wall time, the other thread waiting. */
#define ATTEND_PAR 128
static void attend(const DwRdNet *net, const DwRdProposal *pr, const float *q, float *o,
                   float *w0, float *sc, int threads) {
    int64_t d = net->d, nh = net->heads, dh = d / nh, m = pr->m;
    if (dh == 32 || dh == 64 || dh == 128) {
        float scale = 1.0f / sqrtf((float)dh);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && nh > 1 && m >= ATTEND_PAR)
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = q + h * dh, *keys = pr->keys + h * dh, *vals = pr->vals + h * dh;
            float *oh = o + h * dh, *w = h == 0 ? w0 : NULL, *sh = sc + h * (m + 1);
            switch (dh) { /* NV: the head's vectors of VL lanes */
            case 32: attend_head(qh, keys, vals, d, m, scale, oh, w, sh, 32 / VL); break;
            case 64: attend_head(qh, keys, vals, d, m, scale, oh, w, sh, 64 / VL); break;
            default: attend_head(qh, keys, vals, d, m, scale, oh, w, sh, 128 / VL); break;
            }
        }
        return;
    }
    (void)threads;
    attend_scalar(net, pr, q, o, w0, sc);
}

/* One drafting step for b rows; see the file's comment. s_prev (rows of the previous
 * step, or NULL at the first step: U s = 0), s_out (b, C), out (b, K + E). Returns 0, or
 * 1 when scratch memory could not be allocated. */
int dw_rd_step(const DwRdNet *net, const DwRdProposal *pr, const int64_t *tokens,
               const int64_t *parents, int64_t b, const float *s_prev, float *s_out,
               float *out, int threads) {
    const int64_t c = net->c, d = net->d, kd = net->kdraft, e = pr->e, m = d ? pr->m : 0;
    const int64_t width = kd + e, c2 = 2 * c;
    /* scratch: emb (b, 2C) = [s, e] for the query, sp (b, C), q (b, D), o (b, D),
     * w0 (b, m), sc (heads, m + 1), z0 (b, C), x (b, 2C), t (b, 2C), z (b, C) */
    const int64_t nsc = (d ? net->heads : 1) * (m + 1);
    size_t floats = (size_t)(b * (3 * c2 + 3 * c + 2 * d + m) + nsc);
    float *buf = (float *)malloc(sizeof(float) * floats);
    if (buf == NULL) return 1;
    float *se = buf, *sp = se + b * c2, *q = sp + b * c, *o = q + b * d, *w0 = o + b * d;
    float *sc = w0 + b * m, *z0 = sc + nsc, *x = z0 + b * c, *t = x + b * c2;
    float *z = t + b * c2;

    /* the cell: se[r] = [s, e] (s filled below) */
    for (int64_t r = 0; r < b; r++) {
        const uint16_t *row = net->embed + tokens[r] * c;
        for (int64_t i = 0; i < c; i++) se[r * c2 + c + i] = bf16f(row[i]);
    }
    i8_mv(&net->w, se + c, c2, b, s_out, c, threads);
    if (s_prev != NULL) {
        for (int64_t r = 0; r < b; r++) memcpy(sp + r * c, s_prev + parents[r] * c, sizeof(float) * c);
        i8_mv(&net->u, sp, c, b, t, c, threads);
        for (int64_t i = 0; i < b * c; i++) s_out[i] += t[i];
    }
    silu_n(s_out, b * c);

    /* the context's attention and read-out */
    memcpy(z0, s_out, sizeof(float) * b * c);
    if (d) {
        for (int64_t r = 0; r < b; r++) memcpy(se + r * c2, s_out + r * c, sizeof(float) * c);
        i8_mv(&net->q_se, se, c2, b, q, d, threads);
        for (int64_t r = 0; r < b; r++) {
            for (int64_t i = 0; i < d; i++) q[r * d + i] += pr->hq[i];
            if (m) attend(net, pr, q + r * d, o + r * d, w0 + r * m, sc, threads);
            else for (int64_t i = 0; i < d; i++) o[r * d + i] = 0.0f;
        }
        i8_mv(&net->wo, o, d, b, t, c, threads);
        for (int64_t i = 0; i < b * c; i++) z0[i] += t[i];
    }

    /* the head: ResBlocks on [h, z0], the projection, the draft rows and the extra ids */
    i8_mv(&net->res_s, z0, c, b, t, c2, threads);
    for (int64_t r = 0; r < b; r++) {
        for (int64_t i = 0; i < c2; i++) t[r * c2 + i] += pr->hr[i];
        silu_n(t + r * c2, c2);
        for (int64_t i = 0; i < c2; i++) {
            float base = i < c ? pr->h[i] : z0[r * c + i - c];
            x[r * c2 + i] = base + t[r * c2 + i];
        }
    }
    for (int64_t l = 0; l < net->nres; l++) {
        i8_mv(&net->res[l], x, c2, b, t, c2, threads);
        silu_n(t, b * c2);
        for (int64_t i = 0; i < b * c2; i++) x[i] += t[i];
    }
    i8_mv(&net->proj, x, c2, b, z, c, threads);
    i8_mv(&net->head, z, c, b, out, width, threads);
    int par = threads > 1 && e * c * b >= (1 << 16);
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t i = 0; i < e; i++) {
        const uint16_t *row = net->embed + pr->extra[i] * c;
        for (int64_t r = 0; r < b; r++) out[r * width + kd + i] = dot_bf(z + r * c, row, c) + pr->xbias;
    }

    /* the distribution */
    for (int64_t r = 0; r < b; r++) {
        float *l = out + r * width;
        float mx = max_of(l, width);
        if (!d) {
            float tot = 0.0f;
            for (int64_t i = 0; i < width; i++) tot += expf(l[i] - mx);
            float lse = mx + logf(tot);
            for (int64_t i = 0; i < width; i++) l[i] -= lse;
            continue;
        }
        float tot = exp_shift(l, width, mx);
        const float *gw = net->g_so;
        float g = pr->hg + dot_f(gw, s_out + r * c, c) + dot_f(gw + c, o + r * d, d);
        g = 1.0f / (1.0f + expf(-g));
        float keep = (1.0f - g) / tot;
        for (int64_t i = 0; i < width; i++) l[i] = keep * l[i];
        for (int64_t j = 0; j < m; j++)
            if (pr->cols[j] >= 0) l[pr->cols[j]] += g * w0[r * m + j];
        for (int64_t i = 0; i < width; i++) l[i] += COPY_EPS;
        float inv = 1.0f / sum_of(l, width);
        for (int64_t i = 0; i < width; i++) l[i] *= inv;
    }
    free(buf);
    return 0;
}

/* A one-beam draft (beam search at width 1) of up to t tokens from root: each step feeds
 * the previous step's most probable column (the lowest of equals), as its target id
 * ids[column] (ids (K + E,)). tokens (t,) the chosen ids, logp (t,) their
 * log-probabilities; *made the number drafted. min_path (t,) or NULL: the chain ends
 * after token j when its path log-probability (logp[0] + .. + logp[j]) is below
 * min_path[j + 1] (the next token's path, never more probable, could not reach it).
 * Returns 0, or 1 when memory could not be allocated. */
int dw_rd_chain(const DwRdNet *net, const DwRdProposal *pr, int64_t root, int64_t t,
                const int64_t *ids, const float *min_path, int64_t *tokens, float *logp,
                int64_t *made, int threads) {
    const int64_t c = net->c, width = net->kdraft + pr->e;
    float *buf = (float *)malloc(sizeof(float) * (size_t)(2 * c + width));
    if (buf == NULL) return 1;
    float *s_a = buf, *s_b = buf + c, *out = buf + 2 * c;
    int64_t tok = root, par = -1;
    float path = 0.0f;
    *made = 0;
    for (int64_t j = 0; j < t; j++) {
        float *s_new = (j % 2) ? s_b : s_a, *s_old = (j % 2) ? s_a : s_b;
        if (dw_rd_step(net, pr, &tok, &par, 1, j ? s_old : NULL, s_new, out, threads)) {
            free(buf);
            return 1;
        }
        int64_t best = argmax_of(out, width);
        logp[j] = net->d ? logf(out[best]) : out[best];
        tokens[j] = tok = ids[best];
        par = 0;
        *made = j + 1;
        path += logp[j];
        if (min_path != NULL && j + 1 < t && path < min_path[j + 1]) break;
    }
    free(buf);
    return 0;
}

#else

int dw_rd_vnni(void) { return 0; }
void dw_rd_use_vnni(int on) { (void)on; }
int dw_rd_tiles(void) { return 0; }
void dw_rd_use_tiles(int on) { (void)on; }

int dw_rd_chain(const void *net, const void *pr, int64_t root, int64_t t, const int64_t *ids,
                const float *min_path, int64_t *tokens, float *logp, int64_t *made,
                int threads) {
    (void)net; (void)pr; (void)root; (void)t; (void)ids; (void)min_path; (void)tokens;
    (void)logp; (void)made; (void)threads;
    return 2;
}

int dw_rd_start(const void *res_h, const void *q_h, const float *g_h, float g_b,
                const void *x, int x_bf16, const float *norm, float eps, int64_t c, float *h,
                float *hr, float *hq, float *hg, int threads) {
    (void)res_h; (void)q_h; (void)g_h; (void)g_b; (void)x; (void)x_bf16; (void)norm;
    (void)eps; (void)c;
    (void)h; (void)hr; (void)hq; (void)hg; (void)threads;
    return 2;
}

int dw_rd_entries(const void *wk, const void *wv, const void *const *rows, int x_bf16,
                  int64_t cnt, const float *norm, float eps, const uint16_t *embed,
                  const int64_t *tok, int64_t c, float *keys, float *vals, int threads) {
    (void)wk; (void)wv; (void)rows; (void)x_bf16; (void)cnt; (void)norm; (void)eps; (void)embed;
    (void)tok; (void)c; (void)keys; (void)vals; (void)threads;
    return 2;
}

int dw_rd_step(const void *net, const void *pr, const int64_t *tokens, const int64_t *parents,
               int64_t b, const float *s_prev, float *s_out, float *out, int threads) {
    (void)net; (void)pr; (void)tokens; (void)parents; (void)b; (void)s_prev; (void)s_out;
    (void)out; (void)threads;
    return 2;
}

#endif
