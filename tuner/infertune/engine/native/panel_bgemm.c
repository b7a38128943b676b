/* bf16 GEMM against weights packed in 16-column panels of k-pairs, fp32 accumulation.
 *
 * out[m, n] = sum_k x[m, k] * w[k, n] in fp32, x and w bf16. Panel p holds columns
 * [16p, 16p + 16) as [K / 2, 16, 2]: row j is 16 columns' (w[2j, n], w[2j + 1, n]) pairs,
 * 64 bytes, exactly one AVX512-BF16 `vdpbf16ps` operand against a broadcast (x[2j], x[2j+1])
 * pair. A decode step (a handful of rows) streams every weight once: at one row it is a
 * memory-bound matrix-vector product, where torch's bf16 `mm` (oneDNN) spent ~0.6 ms per
 * SmolLM2-135M layer weight here, 3x the bytes' time at this host's bandwidth.
 *
 * Two paths with one layout and one contract: AVX512-BF16 (4 panels x 4 rows a tile, 16 zmm
 * accumulators), and AVX2 + FMA for CPUs without it (each bf16 widened to fp32 by a shift,
 * the same products summed in fp32). Products of two bf16 are exact in fp32; the sums' order
 * differs between the paths (vdpbf16ps adds a pair at a time), so results agree to fp32
 * rounding, not bit for bit. The caller picks the path (`isa`, from /proc/cpuinfo's flags);
 * the AVX512 code is compiled with a target attribute and never runs on a CPU without it.
 */
#include <string.h>

#include "simd.h"

#define PANEL 16
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline int32_t pair_at(const bf16_t *row, long j)
{
    int32_t v;
    memcpy(&v, row + 2 * j, 4);
    return v;
}

AVX512BF16 static inline __attribute__((always_inline)) void tile512(
    const int mb, const int np, const bf16_t *x, long ldx, long K2,
    const bf16_t *w, float *out, long ldo)
{
    __m512 acc[4][4];
    for (int r = 0; r < 4; ++r)
        for (int p = 0; p < 4; ++p) acc[r][p] = _mm512_setzero_ps();
    const long pstride = K2 * 2 * PANEL;
    for (long j = 0; j < K2; ++j) {
        __m512bh wv[4];
        for (int p = 0; p < np; ++p)
            wv[p] = (__m512bh)_mm512_loadu_si512((const void *)(w + p * pstride + j * 2 * PANEL));
        for (int r = 0; r < mb; ++r) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair_at(x + r * ldx, j));
            for (int p = 0; p < np; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], xb, wv[p]);
        }
    }
    for (int r = 0; r < mb; ++r)
        for (int p = 0; p < np; ++p) _mm512_storeu_ps(out + r * ldo + p * PANEL, acc[r][p]);
}

#define TILE512(MB, NP) tile512(MB, NP, x + m * ldx, ldx, K2, w, out + m * ldo + p0 * PANEL, ldo)

AVX512BF16 static void bgemm512(
    const bf16_t *x, long M, long K2, long ldx, const bf16_t *panels, long P,
    float *out, long ldo, int parallel)
{
    const long groups = (P + 3) / 4;
    #pragma omp parallel for schedule(static) if (parallel)
    for (long g = 0; g < groups; ++g) {
        const long p0 = 4 * g;
        const int np = P - p0 < 4 ? (int)(P - p0) : 4;
        const bf16_t *w = panels + p0 * K2 * 2 * PANEL;
        for (long m = 0; m < M; m += 4) {
            const int mb = M - m < 4 ? (int)(M - m) : 4;
            switch (mb * 8 + np) { /* constant shapes: the loops above unroll, acc stays in registers */
            case 8 + 1: TILE512(1, 1); break;
            case 8 + 2: TILE512(1, 2); break;
            case 8 + 3: TILE512(1, 3); break;
            case 8 + 4: TILE512(1, 4); break;
            case 16 + 1: TILE512(2, 1); break;
            case 16 + 2: TILE512(2, 2); break;
            case 16 + 3: TILE512(2, 3); break;
            case 16 + 4: TILE512(2, 4); break;
            case 24 + 1: TILE512(3, 1); break;
            case 24 + 2: TILE512(3, 2); break;
            case 24 + 3: TILE512(3, 3); break;
            case 24 + 4: TILE512(3, 4); break;
            case 32 + 1: TILE512(4, 1); break;
            case 32 + 2: TILE512(4, 2); break;
            case 32 + 3: TILE512(4, 3); break;
            default: TILE512(4, 4); break;
            }
        }
    }
}

/* AVX2: one panel, up to 4 rows; a 64-byte pair row is two ymm of 8 columns' pairs each. */
static inline __attribute__((always_inline)) void tile256(
    const int mb, const bf16_t *x, long ldx, long K2, const bf16_t *w, float *out, long ldo)
{
    __m256 lo[4], hi[4];
    for (int r = 0; r < 4; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    for (long j = 0; j < K2; ++j) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(w + j * 2 * PANEL));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(w + j * 2 * PANEL + PANEL));
        const __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)); /* w[2j] of columns 0-7 */
        const __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(a, top)); /* w[2j + 1] */
        const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)); /* columns 8-15 */
        const __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(b, top));
        for (int r = 0; r < mb; ++r) {
            const bf16_t *xr = x + r * ldx + 2 * j;
            const __m256 x0 = _mm256_set1_ps(bf2f(xr[0])), x1 = _mm256_set1_ps(bf2f(xr[1]));
            lo[r] = _mm256_fmadd_ps(x1, a1, _mm256_fmadd_ps(x0, a0, lo[r]));
            hi[r] = _mm256_fmadd_ps(x1, b1, _mm256_fmadd_ps(x0, b0, hi[r]));
        }
    }
    for (int r = 0; r < mb; ++r) {
        _mm256_storeu_ps(out + r * ldo, lo[r]);
        _mm256_storeu_ps(out + r * ldo + 8, hi[r]);
    }
}

static void bgemm256(
    const bf16_t *x, long M, long K2, long ldx, const bf16_t *panels, long P,
    float *out, long ldo, int parallel)
{
    #pragma omp parallel for schedule(static) if (parallel)
    for (long p = 0; p < P; ++p) {
        const bf16_t *w = panels + p * K2 * 2 * PANEL;
        for (long m = 0; m < M; m += 4) {
            const bf16_t *xm = x + m * ldx;
            float *o = out + m * ldo + p * PANEL;
            switch (M - m < 4 ? M - m : 4) {
            case 1: tile256(1, xm, ldx, K2, w, o, ldo); break;
            case 2: tile256(2, xm, ldx, K2, w, o, ldo); break;
            case 3: tile256(3, xm, ldx, K2, w, o, ldo); break;
            default: tile256(4, xm, ldx, K2, w, o, ldo); break;
            }
        }
    }
}

/* out [M, 16 P] fp32 (row stride ldo) = x [M, K] bf16 (row stride ldx, K even) @ panels.
 * isa 1: AVX512-BF16 (the caller checked the CPU has it), 0: AVX2 + FMA. */
void infertune_panel_bgemm(
    const bf16_t *x, long M, long K, long ldx, const bf16_t *panels, long P,
    float *out, long ldo, int isa, int parallel)
{
    if (isa == 1) bgemm512(x, M, K / 2, ldx, panels, P, out, ldo, parallel);
    else bgemm256(x, M, K / 2, ldx, panels, P, out, ldo, parallel);
}
