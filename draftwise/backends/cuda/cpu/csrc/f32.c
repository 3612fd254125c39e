/* float32 matmul for the torch backend's float32 mode on CPUs with AVX2 and FMA
 * (draftwise/backends/cuda/cpu/f32.py packs the weights, native.py builds and loads this and
 * takes it by default wherever it builds).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k], accumulated k = 0, 1, ..., K-1 in order with one fused
 * multiply-add per term, starting from 0, in one vector lane.
 *
 * Why: on such a CPU (measured: AMD EPYC Zen 1, 2 threads, MKL through torch) a matmul of
 * 1 to 4 rows against a (1536, 576) weight runs at ~18 GFLOP/s, so verifying 4 rows costs
 * 2.1x one row, while the hardware does 4 rows in the time it streams the weight once.
 * Here each weight tile is loaded once per chunk of up to ROWS (6) rows, every load feeding
 * 2 x 6 FMAs: extra rows cost FMAs only.
 *
 * Layout: the weight (N, K), N a multiple of 16, packed as (N / 16, K, 16) float32: tile p,
 * input k holds w[16 p .. 16 p + 15, k] (two 8-lane vectors).
 *
 * Row invariance: every output element is one lane's chain of K FMAs in input order,
 * whatever the number of rows, their chunking, the tile's thread or the thread count, so
 * a row's bits never depend on the other rows (the batch-invariant mode's guarantee, and
 * plain decoding equals a verify row bit for bit).
 */
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define ROWS 6
/* floats ahead that a multi-row tile prefetches: 1 KB, measured on the Zen 1 CPU (weights
 * streamed from memory, 40 x (3072, 576)): 4 rows 14.8 -> 11.4 ms against 10.1 for 1 row
 * (which prefetches nothing: it slowed to 11.3 with it) */
#define PREFETCH 256

int dw_f32_ok(void) { return 1; }

/* rb (1..ROWS) rows of x (row stride ldx) times one packed tile (K x 16) into y. */
static inline __attribute__((always_inline)) void tile_rows(
    const float *w, int64_t k, const float *x, int64_t ldx, int rb, float *y, int64_t ldy) {
    __m256 a0[ROWS], a1[ROWS];
    for (int r = 0; r < ROWS; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k; j++) {
        _mm_prefetch((const char *)(w + 16 * j + PREFETCH), _MM_HINT_T0);
        __m256 w0 = _mm256_loadu_ps(w + 16 * j), w1 = _mm256_loadu_ps(w + 16 * j + 8);
        for (int r = 0; r < ROWS; r++) {
            if (r >= rb) break;
            __m256 xb = _mm256_broadcast_ss(x + r * ldx + j);
            a0[r] = _mm256_fmadd_ps(xb, w0, a0[r]);
            a1[r] = _mm256_fmadd_ps(xb, w1, a1[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        if (r >= rb) break;
        _mm256_storeu_ps(y + r * ldy, a0[r]);
        _mm256_storeu_ps(y + r * ldy + 8, a1[r]);
    }
}

/* One row times two tiles at once: four independent chains instead of two, so a single
 * row is not held back by the FMA latency (the same chain per element as tile_rows). */
static inline void tile_pair_1(const float *w, const float *w2, int64_t k, const float *x,
                               float *y) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    for (int64_t j = 0; j < k; j++) {
        __m256 xb = _mm256_broadcast_ss(x + j);
        a0 = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w + 16 * j), a0);
        a1 = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w + 16 * j + 8), a1);
        b0 = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w2 + 16 * j), b0);
        b1 = _mm256_fmadd_ps(xb, _mm256_loadu_ps(w2 + 16 * j + 8), b1);
    }
    _mm256_storeu_ps(y, a0);
    _mm256_storeu_ps(y + 8, a1);
    _mm256_storeu_ps(y + 16, b0);
    _mm256_storeu_ps(y + 24, b1);
}

/* x (t, k) float32 row-major, packed (n / 16, k, 16), y (t, n): y = x w^T. */
int dw_f32_mm(const float *x, int64_t t, int64_t k, const float *packed, int64_t n, float *y,
              int threads) {
    const int64_t tiles = n / 16;
    if (t == 1) {
        const int64_t pairs = tiles / 2;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t p = 0; p < pairs; p++)
            tile_pair_1(packed + 2 * p * k * 16, packed + (2 * p + 1) * k * 16, k, x,
                        y + 32 * p);
        if (tiles % 2)
            tile_rows(packed + (tiles - 1) * k * 16, k, x, k, 1, y + 16 * (tiles - 1), n);
        return 0;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < tiles; p++) {
        const float *w = packed + p * k * 16;
        /* chunks of near-equal size (8 rows: 4 + 4, not 6 + 2); the first pass streams
         * the tile from memory, the later ones find it in cache */
        const int64_t chunks = (t + ROWS - 1) / ROWS;
        for (int64_t c = 0, r0 = 0; c < chunks; c++) {
            const int64_t rb = (t - r0) / (chunks - c);
            const float *xr = x + r0 * k;
            float *yr = y + r0 * n + 16 * p;
            r0 += rb;
            switch ((int)rb) {
            case 6: tile_rows(w, k, xr, k, 6, yr, n); break;
            case 5: tile_rows(w, k, xr, k, 5, yr, n); break;
            case 4: tile_rows(w, k, xr, k, 4, yr, n); break;
            case 3: tile_rows(w, k, xr, k, 3, yr, n); break;
            case 2: tile_rows(w, k, xr, k, 2, yr, n); break;
            default: tile_rows(w, k, xr, k, 1, yr, n); break;
            }
        }
    }
    return 0;
}

#else

int dw_f32_ok(void) { return 0; }

int dw_f32_mm(const float *x, int64_t t, int64_t k, const float *packed, int64_t n, float *y,
              int threads) {
    (void)x; (void)t; (void)k; (void)packed; (void)n; (void)y; (void)threads;
    return 1;
}

#endif
