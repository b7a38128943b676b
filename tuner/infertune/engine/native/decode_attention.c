/* fp32 decode attention straight from the paged KV cache: one query token per sequence.
 *
 * The torch path gathers every sequence's K and V blocks into a contiguous copy, then runs two
 * batched GEMMs and a softmax: at the tiny model's batch 8 and ~150 cached tokens that was
 * ~330 us per layer on this project's 2-core host, most of it the gather (a copy of every
 * cached K/V row) and per-op overhead on [16, 4, 150] tensors. Here each (sequence, kv head)
 * walks its block table once for the scores and once for the values, with the group's query
 * heads sharing each K/V row load (GQA), and nothing is copied.
 *
 * Numerics: scores are scale * dot(q, k) in fp32, softmax as exp(s - max) / sum with a
 * Cephes-style exp (within 2 ulp of expf), values summed in token order.
 *
 * Layouts (all fp32, row-major):
 *   q      [B, n_heads, head_dim] with a row stride of ldq floats between sequences;
 *   cache  one layer: [2 (K, V), n_kv, num_blocks, block_size, head_dim];
 *   tables [B, ld_tables] int64 block ids; lens [B] int64 tokens cached (incl. the new one);
 *   out    [B, n_heads, head_dim] contiguous;
 *   scratch at least B * n_heads * round_up(max(lens), 8) floats.
 * head_dim must be a multiple of 8, n_heads a multiple of n_kv.
 */
#include <math.h>

#include "simd.h"

void infertune_decode_attention(
    const float *q, long ldq, long n_heads, long n_kv, long head_dim,
    const float *cache, long num_blocks, long block_size,
    const long *tables, long ld_tables, const long *lens, long B, float scale,
    float *out, float *scratch, long ld_scratch, int parallel)
{
    const long group = n_heads / n_kv;
    const long plane = num_blocks * block_size * head_dim; /* one kv head's K (or V) */
    #pragma omp parallel for schedule(static) if (parallel)
    for (long bg = 0; bg < B * n_kv; ++bg) {
        const long b = bg / n_kv, g = bg % n_kv, len = lens[b];
        const long *table = tables + b * ld_tables;
        const float *keys = cache + g * plane, *values = cache + (n_kv + g) * plane;
        const long n_blocks = (len + block_size - 1) / block_size;
        if (len <= 0) { /* nothing cached: no attention (the runner never asks for this) */
            for (long h = g * group; h < (g + 1) * group; ++h)
                for (long d = 0; d < head_dim; ++d) out[(b * n_heads + h) * head_dim + d] = 0.f;
            continue;
        }
        for (long j = 0; j < group; ++j) {
            const long head = g * group + j;
            const float *qh = q + b * ldq + head * head_dim;
            float *s = scratch + (b * n_heads + head) * ld_scratch;
            float mx = -INFINITY;
            for (long i = 0; i < n_blocks; ++i) { /* scores, one contiguous block at a time */
                const float *k = keys + table[i] * block_size * head_dim;
                const long rows = len - i * block_size < block_size ? len - i * block_size : block_size;
                float *si = s + i * block_size;
                for (long r = 0; r < rows; ++r, k += head_dim) {
                    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(k));
                    for (long d = 8; d < head_dim; d += 8)
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(k + d), acc);
                    si[r] = hsum(acc) * scale;
                    mx = si[r] > mx ? si[r] : mx;
                }
            }
            const long padded = (len + 7) & ~7L;
            for (long t = len; t < padded; ++t) s[t] = -INFINITY; /* exp -> ~0, never summed */
            const __m256 vmax = _mm256_set1_ps(mx);
            for (long t = 0; t < padded; t += 8)
                _mm256_storeu_ps(s + t, exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmax)));
            float sum = 0.f;
            for (long t = 0; t < len; ++t) sum += s[t]; /* the token range, in order */
            const __m256 inv = _mm256_set1_ps(1.0f / sum);
            float *o = out + (b * n_heads + head) * head_dim;
            for (long d = 0; d < head_dim; d += 16) { /* values: two registers of head_dim a pass */
                const int two = d + 8 < head_dim;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (long i = 0; i < n_blocks; ++i) {
                    const float *v = values + table[i] * block_size * head_dim + d;
                    const long rows = len - i * block_size < block_size ? len - i * block_size : block_size;
                    const float *si = s + i * block_size;
                    for (long r = 0; r < rows; ++r, v += head_dim) {
                        const __m256 p = _mm256_broadcast_ss(si + r);
                        a0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), a0);
                        if (two) a1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), a1);
                    }
                }
                _mm256_storeu_ps(o + d, _mm256_mul_ps(a0, inv));
                if (two) _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(a1, inv));
            }
        }
    }
}
