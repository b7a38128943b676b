/* A whole decode step of a Llama-family model in one native call: every layer's
 * RMSNorm -> fused QKV GEMM -> RoPE -> KV-cache write -> paged attention -> O GEMM + residual
 * -> RMSNorm -> fused gate/up GEMM -> SiLU * up -> down GEMM + residual, then the final norm.
 *
 * Why: at one running sequence a SmolLM2-135M decode step was ~600 torch ops (20 per layer,
 * 30 layers) of 2-80 us each around GEMMs that are memory-bound matrix-vector products; the
 * ops alone cost about as much as reading the weights. Here the step is one call (plus the LM
 * head), so decode time is the weights' bytes over memory bandwidth, plus attention.
 *
 * Precision (`bf` = 1: bf16 activations, weights and KV cache; 0: fp32 everywhere): a bf16
 * step rounds where transformers' bf16 forward rounds (each GEMM output, the norm's
 * normalised input and its product with the weight, q*cos and rotate(q)*sin and their sum,
 * SiLU, SiLU * up, each residual add); sums inside a GEMM, the norm and attention are fp32.
 * Attention is fp32 softmax(q k^T * scale) v over the cached tokens (the new one included).
 *
 * Layouts: h [B, H] (act dtype, updated in place); layer weights (ptrs[6 l + i]): input norm
 * [H], QKV panels, O panels, post norm [H], gate/up panels (gate's columns first), down
 * panels, packed as kernels.py's pack_panels (fp32) / pack_bf16_panels (bf16); cos and sin
 * [max_pos, head_dim] (act dtype); cache [layers, 2, n_kv, num_blocks, block_size, head_dim];
 * tables [B, ld_tables] int64 block ids; lens [B] tokens cached incl. the new one; slots [B]
 * flat KV slot (block * block_size + offset) of the new token; positions [B].
 * Requirements the caller checks: H, head_dim multiples of 16, n_heads a multiple of n_kv.
 */
#include <math.h>
#include <stddef.h>

#include "simd.h"

#define PANEL 16

void infertune_panel_sgemm(
    const float *x, long M, long K, long ldx, const float *panels, long p_begin, long p_end,
    const float *init, long ldi, float *out, long ldo, int parallel);
void infertune_panel_bgemm(
    const bf16_t *x, long M, long K, long ldx, const bf16_t *panels, long P,
    float *out, long ldo, int isa, int parallel);

typedef struct {
    long B, H, n_heads, n_kv, head_dim, inter, longest;
} dims_t;

static long round8(long n) { return (n + 7) & ~7L; }

/* Scratch (bytes) for one step; the same arithmetic lays it out in infertune_decode_step. */
long infertune_decode_scratch_bytes(
    long B, long H, long n_heads, long n_kv, long head_dim, long inter, long longest)
{
    const long qkv = (n_heads + 2 * n_kv) * head_dim, q = n_heads * head_dim;
    long widest = qkv > H ? qkv : H;
    widest = 2 * inter > widest ? 2 * inter : widest;
    long xw = H > q ? H : q;
    xw = inter > xw ? inter : xw;
    /* act buffers counted as fp32 (enough for either dtype), 64 bytes of slack each */
    return 4 * (B * xw + B * qkv + B * widest + B * q + B * n_heads * round8(longest)) + 5 * 64;
}

/* RMSNorm of B rows of h into x: w * round(h * rsqrt(mean(h^2) + eps)) (rounded for bf16). */
static void rms_norm(const void *h, void *x, const void *w, long B, long H, float eps, int bf)
{
    for (long b = 0; b < B; ++b) {
        const long o = b * H;
        __m256 ss = _mm256_setzero_ps();
        for (long i = 0; i < H; i += 8) {
            const __m256 v = ld8(h, o + i, bf);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(ss) / (float)H + eps));
        for (long i = 0; i < H; i += 8) {
            const __m256 n = rnd8(_mm256_mul_ps(ld8(h, o + i, bf), inv), bf);
            st8(x, o + i, _mm256_mul_ps(ld8(w, i, bf), n), bf);
        }
    }
}

/* acc [B, N] fp32 GEMM result -> dst in the act dtype (rounded for bf16). */
static void store_rows(const float *acc, void *dst, long n, int bf)
{
    for (long i = 0; i < n; i += 8) st8(dst, i, _mm256_loadu_ps(acc + i), bf);
}

/* x [B, K] (act dtype) @ panels -> out [B, N] fp32; for fp32 with init (may alias out). */
static void gemm(const void *x, long B, long K, const void *panels, long N, const float *init,
                 float *out, int bf, int isa, int parallel)
{
    if (bf) infertune_panel_bgemm((const bf16_t *)x, B, K, K, (const bf16_t *)panels, N / PANEL, out, N, isa, parallel);
    else infertune_panel_sgemm((const float *)x, B, K, K, (const float *)panels, 0, N / PANEL, init, N, out, N, parallel);
}

/* x * cos + rotate_half(x) * sin for n_heads heads of one token, in place. */
static void rope(void *x, long heads, long hd, const void *cos, const void *sin, int bf)
{
    const long half = hd / 2;
    for (long hh = 0; hh < heads; ++hh) {
        const long o = hh * hd;
        for (long d = 0; d < half; d += 8) {
            const __m256 x1 = ld8(x, o + d, bf), x2 = ld8(x, o + d + half, bf);
            const __m256 c1 = ld8(cos, d, bf), c2 = ld8(cos, d + half, bf);
            const __m256 s1 = ld8(sin, d, bf), s2 = ld8(sin, d + half, bf);
            const __m256 y1 = _mm256_sub_ps(rnd8(_mm256_mul_ps(x1, c1), bf), rnd8(_mm256_mul_ps(x2, s1), bf));
            const __m256 y2 = _mm256_add_ps(rnd8(_mm256_mul_ps(x2, c2), bf), rnd8(_mm256_mul_ps(x1, s2), bf));
            st8(x, o + d, y1, bf);
            st8(x, o + d + half, y2, bf);
        }
    }
}

static void copy_row(void *dst, long di, const void *src, long si, long n, int bf)
{
    const size_t e = bf ? 2 : 4;
    memcpy((char *)dst + di * e, (const char *)src + si * e, n * e);
}

/* One query token per sequence against its cached K/V (one layer): q rows of stride ldq. */
static void attention(const dims_t *d, const void *q, long ldq, const void *cache, long num_blocks,
                      long block_size, const long *tables, long ld_tables, const long *lens,
                      float scale, void *out, float *scratch, int bf, int parallel)
{
    const long group = d->n_heads / d->n_kv, hd = d->head_dim, ld_s = round8(d->longest);
    const long plane = num_blocks * block_size * hd;
    #pragma omp parallel for schedule(static) if (parallel)
    for (long bg = 0; bg < d->B * d->n_kv; ++bg) {
        const long b = bg / d->n_kv, g = bg % d->n_kv, len = lens[b];
        const long *table = tables + b * ld_tables;
        const long n_blocks = (len + block_size - 1) / block_size;
        const long kbase = g * plane, vbase = (d->n_kv + g) * plane;
        for (long j = 0; j < group; ++j) {
            const long head = g * group + j;
            const long qo = b * ldq + head * hd;
            float *s = scratch + (b * d->n_heads + head) * ld_s;
            float mx = -INFINITY;
            for (long i = 0; i < n_blocks; ++i) {
                const long rows = len - i * block_size < block_size ? len - i * block_size : block_size;
                long ko = kbase + table[i] * block_size * hd;
                for (long r = 0; r < rows; ++r, ko += hd) {
                    __m256 acc = _mm256_setzero_ps();
                    for (long e = 0; e < hd; e += 8)
                        acc = _mm256_fmadd_ps(ld8(q, qo + e, bf), ld8(cache, ko + e, bf), acc);
                    const float v = hsum(acc) * scale;
                    s[i * block_size + r] = v;
                    mx = v > mx ? v : mx;
                }
            }
            const long padded = round8(len);
            for (long t = len; t < padded; ++t) s[t] = -INFINITY;
            const __m256 vmax = _mm256_set1_ps(mx);
            for (long t = 0; t < padded; t += 8)
                _mm256_storeu_ps(s + t, exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmax)));
            float sum = 0.f;
            for (long t = 0; t < len; ++t) sum += s[t];
            const __m256 inv = _mm256_set1_ps(1.0f / sum);
            const long oo = (b * d->n_heads + head) * hd;
            for (long e = 0; e < hd; e += 16) {
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (long i = 0; i < n_blocks; ++i) {
                    const long rows = len - i * block_size < block_size ? len - i * block_size : block_size;
                    long vo = vbase + table[i] * block_size * hd + e;
                    const float *si = s + i * block_size;
                    for (long r = 0; r < rows; ++r, vo += hd) {
                        const __m256 p = _mm256_broadcast_ss(si + r);
                        a0 = _mm256_fmadd_ps(p, ld8(cache, vo, bf), a0);
                        a1 = _mm256_fmadd_ps(p, ld8(cache, vo + 8, bf), a1);
                    }
                }
                st8(out, oo + e, _mm256_mul_ps(a0, inv), bf);
                st8(out, oo + e + 8, _mm256_mul_ps(a1, inv), bf);
            }
        }
    }
}

/* h += round(acc) (bf16: the sum rounded too); fp32 steps fold the residual into the GEMM. */
static void add_residual(void *h, const float *acc, long n)
{
    for (long i = 0; i < n; i += 8) {
        const __m256 v = _mm256_add_ps(load8_bf16((bf16_t *)h + i), round8_bf16(_mm256_loadu_ps(acc + i)));
        store8_bf16((bf16_t *)h + i, round8_bf16(v));
    }
}

/* silu(gate) * up for B rows of [gate | up] (fp32 GEMM output) into act [B, inter]. */
static void silu_mul(const float *gu, void *act, long B, long inter, int bf)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    for (long b = 0; b < B; ++b) {
        const float *g = gu + b * 2 * inter, *u = g + inter;
        for (long i = 0; i < inter; i += 8) {
            const __m256 gv = rnd8(_mm256_loadu_ps(g + i), bf), uv = rnd8(_mm256_loadu_ps(u + i), bf);
            const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            const __m256 s = rnd8(_mm256_div_ps(gv, _mm256_add_ps(one, e)), bf);
            st8(act, b * inter + i, _mm256_mul_ps(s, uv), bf);
        }
    }
}

void infertune_decode_step(
    int bf, int isa, long n_layers, long B, long H, long n_heads, long n_kv, long head_dim,
    long inter, float eps, float scale, const void *const *weights, const void *final_norm,
    void *h, void *x_out, const long *positions, const void *cos, const void *sin,
    void *cache, long num_blocks, long block_size, const long *tables, long ld_tables,
    const long *lens, const long *slots, long longest, void *scratch, int parallel)
{
    const dims_t d = {B, H, n_heads, n_kv, head_dim, inter, longest};
    const long e = bf ? 2 : 4, q_size = n_heads * head_dim, kv_size = n_kv * head_dim;
    const long nqkv = q_size + 2 * kv_size;
    long widest = nqkv > H ? nqkv : H;
    widest = 2 * inter > widest ? 2 * inter : widest;
    long xw = H > q_size ? H : q_size;
    xw = inter > xw ? inter : xw;
    char *p = (char *)scratch;
    void *x = p;                  p += ((B * xw * e + 63) & ~63L);
    void *qkv = p;                p += ((B * nqkv * e + 63) & ~63L);
    float *acc = (float *)p;      p += ((B * widest * 4 + 63) & ~63L);
    void *attn = p;               p += ((B * q_size * e + 63) & ~63L);
    float *scores = (float *)p;
    const long layer_elems = 2 * n_kv * num_blocks * block_size * head_dim;
    const long plane = num_blocks * block_size * head_dim;
    for (long l = 0; l < n_layers; ++l) {
        const void *const *w = weights + 6 * l;
        char *lc = (char *)cache + l * layer_elems * e;
        rms_norm(h, x, w[0], B, H, eps, bf);
        if (bf) {
            gemm(x, B, H, w[1], nqkv, NULL, acc, bf, isa, parallel);
            store_rows(acc, qkv, B * nqkv, bf);
        } else {
            gemm(x, B, H, w[1], nqkv, NULL, (float *)qkv, bf, isa, parallel);
        }
        for (long b = 0; b < B; ++b) {
            char *row = (char *)qkv + b * nqkv * e;
            const long pos = positions[b];
            rope(row, n_heads + n_kv, head_dim, (const char *)cos + pos * head_dim * e,
                 (const char *)sin + pos * head_dim * e, bf);
            for (long g = 0; g < n_kv; ++g) {
                copy_row(lc, g * plane + slots[b] * head_dim, row, q_size + g * head_dim, head_dim, bf);
                copy_row(lc, (n_kv + g) * plane + slots[b] * head_dim, row, q_size + kv_size + g * head_dim, head_dim, bf);
            }
        }
        attention(&d, qkv, nqkv, lc, num_blocks, block_size, tables, ld_tables, lens, scale, attn,
                  scores, bf, parallel);
        if (bf) {
            gemm(attn, B, q_size, w[2], H, NULL, acc, bf, isa, parallel);
            add_residual(h, acc, B * H);
        } else {
            gemm(attn, B, q_size, w[2], H, (const float *)h, (float *)h, bf, isa, parallel);
        }
        rms_norm(h, x, w[3], B, H, eps, bf);
        gemm(x, B, H, w[4], 2 * inter, NULL, acc, bf, isa, parallel);
        silu_mul(acc, x, B, inter, bf);
        if (bf) {
            gemm(x, B, inter, w[5], H, NULL, acc, bf, isa, parallel);
            add_residual(h, acc, B * H);
        } else {
            gemm(x, B, inter, w[5], H, (const float *)h, (float *)h, bf, isa, parallel);
        }
    }
    rms_norm(h, x_out, final_norm, B, H, eps, bf);
}
