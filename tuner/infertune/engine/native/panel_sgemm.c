/* fp32 GEMM against weights packed in 16-column panels, for the engine's few-row decode steps.
 *
 * out[m, n] = init[m, n] + sum_k x[m, k] * w[k, n], with w stored as panels: panel p holds
 * columns [16p, 16p + 16) as a contiguous [K, 16] block. A decode step multiplies a handful of
 * rows by every weight once, so the weights stream from memory and the rows stay in registers:
 * MKL's sgemm repacks its operand on every call and reads the [K, N] weight 64 bytes per row
 * and stride, while a panel is one sequential stream the hardware prefetcher follows.
 * Measured on a 2-core AVX2 host (the tiny model's 17 weights, one thread): 8 rows 2.4 vs
 * 4.0 ms, 32 rows 7.4 vs 8.7 ms, 1 row and 512 rows on par.
 *
 * Each output element is one FMA chain over k in order, starting from init (0, a bias row
 * when ldi == 0, or the residual stream): the same sum as a plain dot product, rounded per FMA.
 *
 * Built at run time with -O3 -mavx2 -mfma -fopenmp (see kernels.py); loaded only on CPUs with both.
 */
#include <immintrin.h>

#define PANEL 16

static inline __attribute__((always_inline)) void tile(
    const int mb, const float *x, long ldx, long K, const float *w,
    const float *init, long ldi, float *out, long ldo)
{
    __m256 a00, a01, a10, a11, a20, a21, a30, a31;
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = _mm256_setzero_ps();
    if (init) {
        a00 = _mm256_loadu_ps(init);
        a01 = _mm256_loadu_ps(init + 8);
        if (mb > 1) { a10 = _mm256_loadu_ps(init + ldi); a11 = _mm256_loadu_ps(init + ldi + 8); }
        if (mb > 2) { a20 = _mm256_loadu_ps(init + 2 * ldi); a21 = _mm256_loadu_ps(init + 2 * ldi + 8); }
        if (mb > 3) { a30 = _mm256_loadu_ps(init + 3 * ldi); a31 = _mm256_loadu_ps(init + 3 * ldi + 8); }
    }
    for (long k = 0; k < K; ++k) {
        const __m256 w0 = _mm256_loadu_ps(w + k * PANEL);
        const __m256 w1 = _mm256_loadu_ps(w + k * PANEL + 8);
        __m256 b = _mm256_broadcast_ss(x + k);
        a00 = _mm256_fmadd_ps(b, w0, a00);
        a01 = _mm256_fmadd_ps(b, w1, a01);
        if (mb > 1) {
            b = _mm256_broadcast_ss(x + ldx + k);
            a10 = _mm256_fmadd_ps(b, w0, a10);
            a11 = _mm256_fmadd_ps(b, w1, a11);
        }
        if (mb > 2) {
            b = _mm256_broadcast_ss(x + 2 * ldx + k);
            a20 = _mm256_fmadd_ps(b, w0, a20);
            a21 = _mm256_fmadd_ps(b, w1, a21);
        }
        if (mb > 3) {
            b = _mm256_broadcast_ss(x + 3 * ldx + k);
            a30 = _mm256_fmadd_ps(b, w0, a30);
            a31 = _mm256_fmadd_ps(b, w1, a31);
        }
    }
    _mm256_storeu_ps(out, a00);
    _mm256_storeu_ps(out + 8, a01);
    if (mb > 1) { _mm256_storeu_ps(out + ldo, a10); _mm256_storeu_ps(out + ldo + 8, a11); }
    if (mb > 2) { _mm256_storeu_ps(out + 2 * ldo, a20); _mm256_storeu_ps(out + 2 * ldo + 8, a21); }
    if (mb > 3) { _mm256_storeu_ps(out + 3 * ldo, a30); _mm256_storeu_ps(out + 3 * ldo + 8, a31); }
}

/* Panels [p_begin, p_end) of the product; rows of x, init and out have strides ldx, ldi, ldo
 * (in floats). init may be NULL (zero). Panel-outer, rows-inner: a panel (K * 64 bytes) stays
 * in L1/L2 while every 4-row block of x passes over it.
 *
 * With `parallel` set, the panels are shared among the OpenMP threads. Built with -fopenmp,
 * this library's libgomp.so.1 resolves to the one torch already loaded, so these are torch's
 * own intra-op threads (torch.set_num_threads sets their number): a second pool would fight
 * torch's spinning workers for the same cores. */
void infertune_panel_sgemm(
    const float *x, long M, long K, long ldx, const float *panels, long p_begin, long p_end,
    const float *init, long ldi, float *out, long ldo, int parallel)
{
    #pragma omp parallel for schedule(static) if (parallel)
    for (long p = p_begin; p < p_end; ++p) {
        const float *w = panels + p * K * PANEL;
        const long n = p * PANEL;
        long m = 0;
        for (; m + 4 <= M; m += 4)
            tile(4, x + m * ldx, ldx, K, w, init ? init + m * ldi + n : 0, ldi, out + m * ldo + n, ldo);
        const float *i = init ? init + m * ldi + n : 0;
        switch (M - m) {
        case 3: tile(3, x + m * ldx, ldx, K, w, i, ldi, out + m * ldo + n, ldo); break;
        case 2: tile(2, x + m * ldx, ldx, K, w, i, ldi, out + m * ldo + n, ldo); break;
        case 1: tile(1, x + m * ldx, ldx, K, w, i, ldi, out + m * ldo + n, ldo); break;
        default: break;
        }
    }
}

/* The ABI version the loader checks (of the whole library), so a stale build is never called. */
int infertune_kernels_abi(void) { return 4; }
